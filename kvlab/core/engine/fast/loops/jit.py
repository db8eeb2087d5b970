"""numba for the compiled loops: its import (without coverage.py), its cache (a folder named by every source the loops
compile), the two decorators (njit: compiled and cached; inline: inlined into its callers), the arrays' ownership
(unowned) and the rules of kvlab.core.engine.rules compiled from their own source (RULES and a name for each)."""

import builtins
import copy
import hashlib
import os
import shutil
import sys
import types
from pathlib import Path

from kvlab.core import block_pool
from kvlab.core.cost import interpolate, step_time
from kvlab.core.engine import closed_loop, engine_core, records, request, rules, scheduler, scheduler_v0

# numba imports coverage.py at its own import (about 0.3 s) only to extend a coverage measurement running in the
# process to compiled code; no such measurement covers these loops, so numba is imported without it (coverage
# stays importable afterwards).
_WITHOUT_COVERAGE = "coverage" not in sys.modules and "numba" not in sys.modules
# numba's cache: NUMBA_CACHE_DIR where set (the Makefile sets the checkout's .cache/numba), else, in a checkout,
# that same folder, so that `make setup`'s compilation serves a `kvlab` command run from any shell.
_CHECKOUT = Path(__file__).resolve().parents[5]
_CACHE_BASE = os.environ.get("NUMBA_CACHE_DIR") or (
    str(_CHECKOUT / ".cache" / "numba") if (_CHECKOUT / "pyproject.toml").is_file() else ""
)
# numba keys a cached function by its own file alone: a loop compiled with an older rules.py (or block_pool.py, ...)
# inlined would load as it was. So the cache lives in a folder named by the contents of every source the loops
# compile (SOURCE_FILES): an edit to any of them compiles the loops afresh.
SOURCE_FILES = [
    Path(m.__file__)
    for m in (
        rules,
        request,
        scheduler,
        scheduler_v0,
        engine_core,
        block_pool,
        closed_loop,
        records,
        step_time,
        interpolate,
    )
] + sorted(Path(__file__).parent.glob("*.py"))
SOURCE_FILES.append(Path(__file__).parents[1] / "arrays.py")
_DIGEST = hashlib.sha256(b"".join(f.read_bytes() for f in SOURCE_FILES)).hexdigest()[:16]
CACHE_DIR = str(Path(_CACHE_BASE) / f"loops-{_DIGEST}") if _CACHE_BASE else ""
if CACHE_DIR and not Path(CACHE_DIR).is_dir():  # loops of older sources are never loaded again
    for _old in Path(_CACHE_BASE).glob("loops-*"):
        shutil.rmtree(_old, ignore_errors=True)
if _WITHOUT_COVERAGE:
    sys.modules["coverage"] = None
try:
    import numba
    from numba.core import cgutils, inline_closurecall, ir
    from numba.extending import intrinsic
    from numba.np.arrayobj import make_array
finally:
    if _WITHOUT_COVERAGE:
        del sys.modules["coverage"]
if CACHE_DIR:
    numba.config.CACHE_DIR = CACHE_DIR  # read when each dispatcher below opens its cache


class _InlinerCopy:
    """The copy module as numba's inliner sees it (numba.core.inline_closurecall.copy), with one change: while it
    inlines a function (InlineWorker.inline_ir), the function's blocks are deep-copied with one memo, as one deepcopy
    of them all would be. numba copies them block by block, each with a fresh memo, so each copies the function's
    whole scope (every variable) again: blocks x variables, about a third of the loops' compilation (numba issue
    8989). The copies are the same IR (the blocks share one copied scope, as the function's blocks share one), and the
    loops the same machine code (the synchronous loop's assembly, 31,753 lines, compared: equal but for names that
    numba numbers per process)."""

    def __init__(self, inliner):
        self.memos = None  # a memo per scope copied, while a function is inlined
        original = inliner.InlineWorker.inline_ir

        def inline_ir(worker, *args, **kwargs):
            outer, self.memos = self.memos, {}
            try:
                return original(worker, *args, **kwargs)
            finally:
                self.memos = outer

        inliner.InlineWorker.inline_ir = inline_ir
        inliner.copy = self

    def deepcopy(self, x, memo=None):
        if memo is None and self.memos is not None and isinstance(x, ir.Block):
            memo = self.memos.setdefault(id(x.scope), {})
        return copy.deepcopy(x, memo)

    def __getattr__(self, name):
        return getattr(copy, name)


_InlinerCopy(inline_closurecall)

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3


def njit(function, inline="never"):
    """numba.njit with its on-disk cache, or without where numba finds no writable place for it. A function not
    inlined is compiled once per type of its arguments, not once per constant: numba would compile cost_s again for
    each call site that passes a literal 0 (five times, a tenth of the loops' compilation) unless told otherwise."""
    try:
        dispatcher = numba.njit(cache=True, nogil=True, inline=inline)(function)
    except RuntimeError:
        dispatcher = numba.njit(nogil=True, inline=inline)(function)
    if inline == "never":
        template = dispatcher.get_call_template  # what numba's typing asks for a call from compiled code

        def get_call_template(args, kws):
            unliteral = numba.core.types.unliteral
            return template(tuple(unliteral(a) for a in args), {k: unliteral(v) for k, v in kws.items()})

        dispatcher.get_call_template = get_call_template
    return dispatcher


def inline(function):
    """njit, the function inlined into its callers at numba's IR level."""
    return njit(function, "always")


def compiled_rules() -> dict:
    """Every function of kvlab.core.engine.rules, a request's transitions (kvlab.core.engine.request, on a request's
    record), closed_loop.send_s and the free queue of kvlab.core.block_pool
    (block_pool.QUEUE), compiled: the same functions the Python engine calls, each with its calls to the others
    resolved to their compiled selves (block_pool's integer constants as its, a request's statuses as the loops').
    The rules and the transitions, whose arguments are numbers and a record, are compiled once each and called (LLVM
    inlines them when it links a loop): inlined at numba's level into every caller, their typing took a third of the
    loops' compilation. The free queue's functions, which take the pool's arrays, are inlined."""
    statuses = dict(WAITING=WAITING, RUNNING=RUNNING, PREEMPTED=PREEMPTED, FINISHED=FINISHED)
    # (__name__: numba caches a function with the module it names, which must import where the cache loads it)
    namespace = (
        {"__builtins__": builtins, "__name__": __name__}
        | {k: v for k, v in vars(block_pool).items() if type(v) is int}
        | statuses
    )
    functions = [
        f for f in vars(rules).values() if isinstance(f, types.FunctionType) and f.__module__ == rules.__name__
    ]
    functions += [request.update_after_schedule, request.preempt_request, request.update_request_with_output]
    functions += [closed_loop.send_s]
    compiled_into(namespace, functions, inlined=False)
    return compiled_into(namespace, [getattr(block_pool, name) for name in block_pool.QUEUE])


def compiled_into(namespace: dict, functions, inlined: bool = True, tag: str = "") -> dict:
    """namespace with each of functions compiled from its own source (inlined into its callers, or where not inlined
    compiled once and called), namespace its globals: their calls to each other resolve to their compiled selves.
    tag: a suffix to a function's qualified name, which numba's cache keys it by (a function compiled twice, with two
    namespaces, is then cached twice)."""
    for function in functions:
        clone = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__)
        clone.__qualname__ = function.__qualname__ + tag
        namespace[function.__name__] = inline(clone) if inlined else njit(clone)
    return namespace


def compiled_from(functions, names: dict, entries=(), tag: str = "") -> dict:
    """functions (the reference's, e.g. kvlab.core.engine.scheduler.schedule), compiled from their own source with the
    rules (RULES) and names (the loops' own functions for the calls each side binds to its own) as their globals;
    each one's calls to the others resolved to their compiled selves. functions are inlined into their callers;
    entries (a loop, e.g. kvlab.core.engine.engine_core.run_sync) are compiled once and called, under their name and
    tag (the namespace's: compiled_into). numba inlines a function by compiling it afresh at every call site, its own
    inlined calls included, so an entry called by a small wrapper compiles in about half the time it takes inlined."""
    namespace = compiled_into(RULES | names, functions)
    return compiled_into(namespace, entries, inlined=False, tag=tag)


def _unowned_value(context, builder, ty, value):
    """value (of numba type ty) with every array in it a view that owns no reference: the same data, shape and
    strides, a null meminfo (so that numba's reference counting skips it)."""
    if isinstance(ty, numba.types.Array):
        src = make_array(ty)(context, builder, value=value)
        dst = make_array(ty)(context, builder)
        for name in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(dst, name, getattr(src, name))
        dst.meminfo = cgutils.get_null_value(dst.meminfo.type)
        dst.parent = cgutils.get_null_value(dst.parent.type)
        return dst._getvalue()
    if isinstance(ty, numba.types.BaseTuple):
        for i, member in enumerate(ty):
            value = builder.insert_value(
                value, _unowned_value(context, builder, member, builder.extract_value(value, i)), i
            )
    return value


@intrinsic
def unowned(typingctx, x):
    """x (an array, or a tuple holding arrays and scalars) with its arrays unowned views (_unowned_value). numba counts
    a reference to an array each time a variable takes it: at every call, inlined or not, for each array argument
    (a tuple's arrays included), and at every field a function unpacks. Those are atomic operations, about two-thirds
    of the compiled loop's time before (perf, 200,000 requests). A loop takes its arguments unowned once, at its start:
    the arrays live through the call (its caller holds them), and no view of them outlives it."""

    def codegen(context, builder, signature, args):
        return _unowned_value(context, builder, signature.args[0], args[0])

    return x(x), codegen


RULES = compiled_rules()
step_token_cap, running_num_new_tokens, allocation_is_noop, num_blocks_to_allocate = (
    RULES[name] for name in ("step_token_cap", "running_num_new_tokens", "allocation_is_noop", "num_blocks_to_allocate")
)
num_lookup_blocks, admission_num_new_tokens, admission_num_new_blocks, preemption_victim = (
    RULES[name]
    for name in ("num_lookup_blocks", "admission_num_new_tokens", "admission_num_new_blocks", "preemption_victim")
)
num_skipped_tokens, admission_blocks = RULES["num_skipped_tokens"], RULES["admission_blocks"]
samples, is_finished, settles_placeholder = (RULES[name] for name in ("samples", "is_finished", "settles_placeholder"))
steps_covered, send_s, window_release_step = RULES["steps_covered"], RULES["send_s"], RULES["window_release_step"]
steps_to_finish, block_phase, blocks_crossed, attention_pairs = (
    RULES[name] for name in ("steps_to_finish", "block_phase", "blocks_crossed", "attention_pairs")
)
update_after_schedule, preempt_request, update_request_with_output = (
    RULES[name] for name in ("update_after_schedule", "preempt_request", "update_request_with_output")
)
num_free, take_blocks, free_table, touch_blocks, cache_full_blocks = (
    RULES[name] for name in ("num_free", "take_blocks", "free_table", "touch_blocks", "cache_full_blocks")
)
