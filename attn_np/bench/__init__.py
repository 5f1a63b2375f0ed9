"""Benchmarks that print ratios measured in the same run (``python -m
attn_np.bench NAME``).

Every figure is reported next to a reference measured moments before on the
same machine (its float32 matmul rate, its streaming-read bandwidth), so the
ratio means the same on any machine.
"""
