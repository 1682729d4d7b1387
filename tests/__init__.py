"""The tests compute in their own process (the engine's tests, the reference runs): the
thread pools are set before anything loads NumPy (engine/thread_env.py)."""

from engine.thread_env import quiet_idle_threads

quiet_idle_threads()
