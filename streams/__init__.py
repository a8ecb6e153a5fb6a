"""How things cross, in order: bounded channels, per-request output streams and the device timeline.

The timeline has a grammar lane and a model lane joined by token and mask events; it has a CPU
implementation and (on a GPU) a CUDA one, and nothing above this folder knows which one runs.
"""
