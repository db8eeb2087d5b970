"""The compiled loops of kvlab.core.engine.fast.compiled (imported only when one runs: they import numba).

Each loop is the Python engine's loop named in its docstring over the named arrays of fast/arrays.py (req: the
Requests, indexed by request id; cfg: the Limits; pool: the Pool); every decision is a rule of
kvlab.core.engine.rules, compiled (jit.RULES) from the same functions the Python engine calls. One module per thing
it mirrors: jit (numba, its cache, the compiled rules), pool (the block pool with prefix caching), groups (a hybrid
model's KV cache groups), scheduler (schedule, account, preempt, update_from_output and the step around them), clock
(the step costs), step_runs (decode and prefill runs in closed form), engine (vLLM 0.33's loops, synchronous and
asynchronous) and v0 (vLLM 0.1.4's loop). The waiting queue is a ring (waiting, its head, its length); the running
list an array and its length; the pool a count of free blocks, or with prefix caching a Pool. The loops take their
arrays unowned (jit.unowned), so that numba counts no references.
"""
