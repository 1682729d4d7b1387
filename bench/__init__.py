"""The benchmarks, each run as its own process (`python -m bench.NAME`): their processes
compute, so the thread pools are set before anything loads NumPy (engine/thread_env.py)."""

from engine.thread_env import quiet_idle_threads

quiet_idle_threads()
