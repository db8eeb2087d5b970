"""The compiled loops of kvlab.core.engine.fast.compiled (imported only when one runs: they import numba).

Each loop is the Python engine's loop named in its docstring over the named arrays of fast/arrays.py (req: the
Requests, indexed by request id, each request's record req.records[r]; cfg: the Limits; pool: the Pool); every
decision is a rule of kvlab.core.engine.rules, and a request's transitions, schedule(), preempt and account are the
reference's own functions (request.py, scheduler.py), all compiled from their source (jit.RULES, jit.compiled_from).
One module per thing it mirrors: jit (numba, its cache, the compiled rules), pool (the block pool with prefix caching),
groups (a hybrid model's KV cache groups), scheduler (the array side of schedule(): the queues, the KV-cache manager's
calls, the batch; update_from_output and the step around them), clock
(the step costs), step_runs (decode runs in closed form), engine (vLLM 0.33's loops, synchronous and
asynchronous) and v0 (vLLM 0.1.4's loop). The waiting queue is a ring (waiting, its head, its length); the running
list an array and its length; the pool a count of free blocks, or with prefix caching a Pool. The loops take their
arrays unowned (jit.unowned), so that numba counts no references.
"""
