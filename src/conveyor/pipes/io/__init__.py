"""Ops that read and write real data: storage (local, fsspec), archives, text formats,
WebDataset, Parquet, images, Hugging Face tables, and the on-disk cache.

Internal: import the ops from ``conveyor.pipes`` (each module is loaded at its op's first use).
"""
