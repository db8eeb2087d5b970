"""The engine's speed code: the same decisions as the reference path (kvlab.core.engine), faster.

compiled runs the per-step loop compiled with numba (the package loops, imported only when a compiled loop runs), with
runs of steps in which nothing can change done at once in closed form (loops.step_runs). It calls the rules of
kvlab.core.engine.rules, never copies of them; tests hold it to the reference loop, bit for bit.
"""
