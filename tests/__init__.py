"""The tests compute in their own process (the engine's tests, the reference runs): their
thread pools and heap are set before anything loads NumPy (engine/thread_env.py)."""

from engine.thread_env import prepare_process

prepare_process()
