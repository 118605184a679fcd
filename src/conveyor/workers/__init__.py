"""The worker runtime of the multiprocessing reading service: what runs in a worker
process or thread, what runs in the main process to drive the workers, and the wire
between them (see docs/DESIGN.md, "Layer: workers"). Internal: nothing here is public API.

A regular package (this file), so that import tools see its modules among conveyor's.
"""
