"""What runs in a worker (a process, or a thread with ``worker_type="thread"``): its event
loop, its epoch's state machine, the dispatched sources it is fed, and its lifeline.

Internal: nothing here is public API.
"""
