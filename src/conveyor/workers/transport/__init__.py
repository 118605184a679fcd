"""The wire between the main process and its workers: the messages, their framing and
encoding, the shared-memory ring and spill files that carry large buffers, thread
channels, and exceptions rebuilt from another process.

Internal: nothing here is public API.
"""
