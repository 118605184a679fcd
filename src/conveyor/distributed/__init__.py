"""Between ranks of a ``torch.distributed`` job: collectives with deadlines, which rank a
failed collective lost, and every rank's part of a loader state (see docs/DESIGN.md,
"Layer: distributed").

Internal: nothing here is public API.
"""
