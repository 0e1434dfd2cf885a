"""How a launch reaches the GPU, with no attention math: backend choice, the simulator patch layer,
SRAM opt-in, direct launch, replay, the simulator cost model, compiled-kernel resources.
"""
