"""What runs in the main process to drive the workers: the pool, each worker process or
thread, the merge of their outputs and the pipe that hands it out, healing and errors.

Internal: nothing here is public API.
"""
