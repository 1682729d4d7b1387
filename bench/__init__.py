"""The benchmarks, each run as its own process (`python -m bench.NAME`): their processes
compute, so the thread pools and heap are set before anything loads NumPy (engine/thread_env.py)."""

from engine.thread_env import prepare_process

prepare_process()
