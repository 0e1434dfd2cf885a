"""The quick tier of the simulator: the cases of the costliest kernel tests that run there by default.

The simulator runs every CUDA thread as a Python thread, so the tensor-core kernels' grids of shapes cost
minutes each there. For each test below the simulator runs one case per kernel (the cheapest, as measured by
``python -m bench.suite_durations RUN.xml --plan``, whose docstring states the rule) and every case of a
readable kernel; the other cases are the exhaustive tier: skipped in the simulator unless ``--runslow``,
always run on a GPU. Every claim keeps a case in the quick tier; what moves out is more shapes of the same
claim. The bug gallery's tests all stay (``tests/test_bug_gallery.py`` checks it).

``tests/conftest.py`` applies it, and fails the collection when an entry names a test or a case that no longer
exists (a renamed test must not fall silently out of the quick tier).
"""

#: "path::function" -> the parametrize ids that run in the simulator without --runslow.
QUICK = {
    "tests/kernels/test_fa2_kernels.py::test_fa2_backward_gradients_within_3x_float32_error": [
        "fast-causal-sq>sk-masked-rows-dropout-d16-atomic-dq",
        "fast-causal-sq>sk-masked-rows-dropout-d16-deterministic",
        "readable-causal-sq<sk-gqa-d12-atomic-dq",
        "readable-causal-sq<sk-gqa-d12-deterministic",
        "readable-causal-sq>sk-masked-rows-dropout-d16-atomic-dq",
        "readable-causal-sq>sk-masked-rows-dropout-d16-deterministic",
        "readable-odd-d5-dropout-b2-atomic-dq",
        "readable-odd-d5-dropout-b2-deterministic",
        "tensorcore0-causal-sq>sk-masked-rows-dropout-d16-atomic-dq",
        "tensorcore0-odd-d5-dropout-b2-deterministic",
        "tensorcore1-causal-sq<sk-gqa-d12-deterministic",
        "tensorcore1-causal-sq>sk-masked-rows-dropout-d16-atomic-dq",
        "tensorcore2-causal-sq>sk-masked-rows-dropout-d16-atomic-dq",
        "tensorcore2-odd-d5-dropout-b2-deterministic",
    ],
    "tests/kernels/test_fa2_kernels.py::test_fa2_forward_equals_standard_attention": [
        "fast-ragged-N20-d8",
        "readable-causal-sq<sk-gqa-d12",
        "readable-causal-sq>sk-masked-rows-dropout-d16",
        "readable-odd-d5-dropout-b2",
        "readable-ragged-N20-d8",
        "tensorcore0-ragged-N20-d8",
        "tensorcore1-ragged-N20-d8",
        "tensorcore2-ragged-N20-d8",
    ],
    "tests/kernels/test_half_backward_cp_async.py::test_cp_async_stages_give_the_register_paths_gradients_bit_for_bit": [
        "bf16-causal-sq>sk-dropout-d8",
        "fp16-causal-d24-padded-chunk",
    ],
    "tests/kernels/test_half_ex2_ftz.py::test_one_instruction_exp2_gives_the_same_bits": [
        "causal-dropout-d48-bf16",
        "causal-dropout-d48-fp16",
    ],
    "tests/kernels/test_half_ex2_ftz.py::test_one_instruction_exp2_gives_the_same_gradient_bits": [
        "causal-dropout-d48-atomic-dq",
        "causal-dropout-d48-deterministic",
    ],
    "tests/kernels/test_half_kernels.py::test_cp_async_pipeline_equals_the_register_path_bit_for_bit": [
        "causal-sq>sk-blocks-without-keys-d24-bf16",
        "causal-sq>sk-blocks-without-keys-d24-fp16",
    ],
    "tests/kernels/test_half_kernels.py::test_half_backward_gives_gradients_within_3x_naive_half_error": [
        "d10-dropout-b2-bf16",
        "d10-dropout-b2-fp16",
    ],
    "tests/kernels/test_half_kernels.py::test_half_forward_is_within_2x_the_error_of_naive_attention_in_its_dtype": [
        "ragged-N37-d16-bf16",
        "ragged-N37-d16-fp16",
    ],
    "tests/kernels/test_half_lse_p.py::test_p_from_the_logsumexp_keeps_the_gradients_within_the_rule": [
        "causal-dropout-d48-deterministic",
        "causal-rows-without-keys-atomic-dq",
    ],
    "tests/kernels/test_head_dims.py::test_head_dims_up_to_256_follow_the_error_rule": [
        "256-flash1-fast",
        "256-flash1-readable",
        "256-flash2-fast",
        "256-flash2-readable",
        "256-flash2-tensorcore",
        "256-standard-readable",
    ],
    "tests/kernels/test_key_block_order.py::test_the_tc_forward_keeps_its_outputs_with_the_heavy_blocks_first": [
        "sq>sk",
    ],
    "tests/kernels/test_tc_forward_cp_async.py::test_cp_async_pipeline_equals_the_register_path_bit_for_bit": [
        "causal-sq>sk-blocks-without-keys-d8",
    ],
    "tests/kernels/test_tc_forward_q_async.py::test_q_by_cp_async_equals_the_register_load_bit_for_bit": [
        "causal-sq>sk-blocks-without-keys-d8",
    ],
    "tests/kernels/test_tc_forward_split_kv.py::test_split_kv_keeps_the_outputs_bit_for_bit": [
        "causal-sq>sk-blocks-without-keys-4warps-d32",
    ],
    "tests/kernels/test_tc_rescale_fma.py::test_rescale_in_the_first_steps_fma_follows_the_error_rule_and_keeps_the_statistics": [
        "causal-sq>sk-blocks-without-keys-d8",
    ],
    "tests/kernels/test_tc_stage_o_step.py::test_o_staged_per_key_step_follows_the_error_rule_and_keeps_the_statistics": [
        "causal-sq>sk-blocks-without-keys-d8",
    ],
    "tests/kernels/test_tc_wide.py::test_wide_fragment_loads_follow_the_error_rule": [
        "causal-sq>sk-blocks-without-keys-d32",
    ],
    "tests/kernels/test_tf32_backward.py::test_tf32_backward_gives_gradients_within_3x_float32_error_at_every_tiling": [
        "1warp-ragged-odd-d5",
    ],
    "tests/kernels/test_tf32_backward_cp_async.py::test_cp_async_stages_give_the_register_paths_gradients_bit_for_bit": [
        "causal-sq>sk-dropout-d8",
    ],
    "tests/kernels/test_tf32_backward_dq_unroll.py::test_dq_k_steps_in_pairs_or_fours_give_the_same_gradients": [
        "causal-dropout-d12",
    ],
    "tests/kernels/test_tf32_backward_kv_async.py::test_k_and_v_by_cp_async_give_the_register_loads_gradients_bit_for_bit": [
        "causal-dropout-d20-padded-chunk",
        "deterministic-causal-sq<sk-unseen-key-blocks-d8",
    ],
    "tests/kernels/test_tf32_backward_split_qdo.py::test_row_pairs_give_the_bits_of_split_q_and_do": [
        "deterministic-causal-sq<sk-dropout-d32",
    ],
    "tests/kernels/test_tf32_backward_split_qdo.py::test_split_q_and_do_give_the_same_dq_and_dv_and_dk_within_the_rule": [
        "deterministic-causal-sq<sk-dropout-d32",
    ],
}
