"""``@cuda.jit`` device helpers that the readable and the fast kernels share: the grid decode, constants, the dropout
hash, the GQA head sums, the FA2 pre-pass.
"""
