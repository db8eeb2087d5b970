"""The engine's speed code: the same decisions as the reference path (kvlab.core.engine), faster.

decode_run jumps over runs of decode steps in which nothing can change, in closed form; compiled runs the per-step
loop compiled with numba (the package loops, imported only when a compiled loop runs). Both call the rules of
kvlab.core.engine.rules, never copies of them; tests hold each to the reference loop, bit for bit.
"""
