#!/usr/bin/env bash
# The GPU measurements the performance log (docs/notes/performance-log.md) asks for next, from the repository root:
#   bash bench/gpu/run_pending.sh [OUTDIR [STEP ...]]
# STEP (default: host, about 3 minutes; streams, tc_cp and half_bwd_cp ran on 2026-11-25, their results were in
# docs/results/sweeps and gpu_runs, last in the tree at e0e5a9b: streams took 8 minutes on an H100, mostly compiling, tc_cp 3, half_bwd_cp 5):
#   streams      tests/test_streams.py and tests/kernels/test_half_backward_cp_async.py (written without a GPU)
#                -> OUTDIR/streams_gpu.txt
#   host         the host probes of a short-sequence call: python -m bench.host_overhead (CUDA tensors; first, with
#                fewer calls: on 2026-11-25 it was cut before printing), python -m bench.short_seq_probe --host and
#                --profile (on 2026-11-25 also with _smem.CACHED_OPT_IN, since removed: docs/results/sweeps/*b7c3ad5*, last in the tree at e0e5a9b)
#                -> OUTDIR/host_overhead_gpu.txt, host_probe.txt, profile.txt
#   tc_cp        the 3xTF32 forward's cp.async sweep that decides CP_ASYNC's default for float32 (fa2_sweep variants
#                tc-cp*; the log's section "3xTF32 forward: cp.async for K_j, V_j") -> OUTDIR/tc_cp_d64.json/.log, _d128
#   ncu_tc       Nsight Compute's full set (--set full) on one 3xTF32 forward at d = 128 and d = 64 and one 3xTF32
#                backward at d = 128 (N 4096, b 4, h 16, float32): where the d = 128 kernels lose to SDPA memory-efficient
#                (shared-memory throughput, issue stalls, tensor-pipe use) -> OUTDIR/ncu_tc_fwd_d128.txt, _fwd_d64, _bwd_d128
#   ncu_causal   Nsight Compute's full set on the 3xTF32 forward at d = 128, N 1024, b 16, h 16 (the grid's shape): causal
#                at its default 4 x 2 x 16 (block_sizes 128 x 16) and non-causal at its default 8 x 2 x 16: what the causal
#                cells lose per key block -> OUTDIR/ncu_causal_fwd_d128.txt, ncu_noncausal_fwd_d128.txt (and _meta.json)
#   ncu_half     Nsight Compute's full set on the bf16 half backward at d = 128 and d = 64 (N 4096, b 4, h 16): where the
#                d = 128 backward loses (#16's remaining cells: SRAM traffic of P and dS, the dQ atomics, register-bound
#                occupancy) -> OUTDIR/ncu_half_bwd_d128.txt, _d64 (and _meta.json)
#   half_ex2     the half forward (N 1k/4k/16k) and forward + backward (N 1k/4k) with P = 2^(S' - m) by ex2.approx.ftz
#                (EX2_FTZ) against their defaults, default tilings, bf16 (the performance log's section "Half forward: one
#                instruction per exp2") and its GPU tests -> OUTDIR/half_ex2_off.json/.log, half_ex2_on, half_ex2_bwd_off,
#                half_ex2_bwd_on, half_ex2_tests.txt
#   half_ex2_pairs  the half forward's default tilings with EX2_FTZ off and on, twice, alternating (N 4k/16k), then the
#                forward + backward on and off (N 4k), bf16, each sweep under a 100-110 s timeout: the paired timing that
#                turned EX2_FTZ on (2026-11-25, 4 minutes on an H100) -> OUTDIR/ex2_fwd_off_1.json/.log, ex2_fwd_on_1,
#                _off_2, _on_2, ex2_bwd_on, ex2_bwd_off; the rows of all of them -> OUTDIR/ex2_pairs.txt
#   ostep        the 3xTF32 forward's STAGE_O_STEP: its GPU tests, then the d = 128 tilings it makes fit (fa2_sweep
#                tc-cp-ostep, tc-cp-MW2-ostep, tc-cp-NW8-MW2-Bc16-ostep against tc-cp, N 4k/16k) and d = 64 (the performance
#                log's section "3xTF32 forward: O staged per key step") -> OUTDIR/ostep_tests.txt, ostep_d128.json/.log, _d64
#   short_d128   the 3xTF32 forward's d = 128 default (8 x 2 x 16 with STAGE_O_STEP) against the former 8 x 1 x 32 at
#                N 1k/2k, with and without causal (fa2_sweep tc-cp, tc-cp-NW8-MW1-Bc32): the short sequences the ostep sweep
#                did not time -> OUTDIR/short_d128.json/.log
#   short_causal the 3xTF32 forward's causal cells at N 1k/2k (below SDPA memory-efficient in the grid) with the default
#                and smaller or 8-warp tilings, d = 64 and 128 -> OUTDIR/short_causal_d64.json/.log, _d128
#   causal_d128  the 3xTF32 forward's causal d = 128 default against 4 x 1 x 32 (Br = 64, the short causal cells' winner)
#                at N 4k/8k/16k -> OUTDIR/causal_d128.json/.log
#   wide_bwd     the 3xTF32 backward's WIDE (S in the order of the forward's WIDE): its GPU tests and the forward's, then
#                the backward alone with and without it at the default tilings, and at d = 128 the default tiling with
#                two cp.async stages (fits with WIDE), N 1k/4k/16k, d 64/128 (the performance log's section "3xTF32
#                backward in the forward's WIDE order") -> OUTDIR/wide_bwd_tests.txt, wide_bwd.json/.log
#   occ3_d128    the 3xTF32 forward at d = 128 with three blocks of 4 x 1 x 16 per SM (STAGE_O_STEP: 166-168 registers
#                offline, 71.5 KB) against the defaults (8 x 2 x 16; causal 4 x 1 x 32), N 1k/4k/16k, and its GPU tests
#                (the performance log's section "3xTF32 forward at d = 128: three blocks per SM") -> OUTDIR/occ3_tests.txt,
#                occ3_d128.json/.log
#   wide_d128    the 3xTF32 forward's WIDE (16-byte fragment loads, Q_i / K_j swizzled) at d = 128: its GPU tests, then
#                the defaults (8 x 2 x 16; causal 4 x 1 x 32) with and without it and 8 x 1 x 32 with it, N 1k/4k/16k (the
#                performance log's section "3xTF32 forward: 16-byte fragment loads"), and d = 64's default with and
#                without it -> OUTDIR/wide_tests.txt, wide_d128.json/.log, wide_d64.json/.log
#   host_layers  python -m bench.host_layers (host time of one forward, layer by layer) and its --profile (a cProfile of
#                flash_attn_func by own time) -> OUTDIR/host_layers.txt, host_profile.txt
#   short_direct the half grid's short cells (bf16, forward N 512/1k/2k, forward + backward N 1k/2k) with the direct launches
#                of numba_flash/runtime/direct.py, against SDPA memory-efficient and flash in the same run, and first our cells
#                from the tree NUMBA_FLASH_BASELINE_TREE (an earlier commit's checkout) if set -> OUTDIR/short_direct.json/.log,
#                short_direct_base.json/.log
#   short_replay the half grid's short cells (as short_direct) with the launches replayed (NUMBA_FLASH_REPLAY=1, the default
#                since 2026-11-26, numba_flash/runtime/replay.py) and without, in the same call, after the GPU tests of the replay
#                -> OUTDIR/short_replay_off.json/.log, short_replay_on.json/.log, replay_tests.txt
#   host_kernels python -m bench.host_layers --kernels: per bf16 training step (b 8 N 256 d 64; N 1k/2k d 128), the kernels'
#                GPU time (torch.profiler) against the synchronized wall time, replay off and on, SDPA beside
#                -> OUTDIR/host_kernels.txt
#   timeline     python -m bench.host_layers --timeline: the half grid cells nearest 1.0x (causal training step d 128
#                N 1k, causal forward N 512), ours and SDPA memory-efficient, event by event (host launches, allocations,
#                synchronize; GPU kernels)
#                -> OUTDIR/timeline.txt
#   host_kernels_ab  host_kernels on the tree NUMBA_FLASH_BASELINE_TREE (an earlier commit's checkout, its commit in
#                NUMBA_FLASH_BASELINE_COMMIT for the files' header) and on this one,
#                alternating, twice: a host-path change's effect on the training steps' GPU idle, one machine
#                -> OUTDIR/host_kernels_{base,new}_{1,2}.txt
#   heavy_first_d64  the 3xTF32 backward alone at d = 64 with HEAVY_FIRST off and on (tf32_bwd_sweep rows default-hf0 /
#                default-hf1, N 1k/2k/4k, causal and not), two runs -> OUTDIR/heavy_first_d64_{1,2}.json/.log
#   short_kernels the half forward's tilings (half_sweep's TILINGS, Br = 64 among them) at N 512/1k/2k, bf16, each timing
#                the mean of 10 back-to-back calls (the kernels, not one call's host work), SDPA beside them
#                -> OUTDIR/short_kernels.json/.log
#   lse_p        the half backward's LSE_P (P from the logsumexp alone: one FFMA and one exponential per element) off and on,
#                twice, alternating, default tilings, N 1k/2k/4k, d 64 and 128, causal and not (forward + backward timed), after
#                its GPU tests -> OUTDIR/lse_p_tests.txt, lse_p_off_1.json/.log, lse_p_on_1, _off_2, _on_2
#   prepass      the GPU tests of the fast backwards' pre-pass (numba_flash/fast/_prepass.py: a warp per row, dQ's zeros)
#                and of the backwards that use it (their gpu-marked tests) -> OUTDIR/prepass_tests.txt; run host_kernels
#                after it for the pre-pass kernel's time beside cuDNN's
#   prepass_probe  the pre-pass's GPU tests (rows_per_group 1 and 4), then python -m bench.prepass_probe: the pre-pass with
#                dQ's zeros fused, 1/2/4/8 rows a warp, against the pre-pass alone plus torch's zero_ of dQ, bf16 and float32,
#                d 64/128, N 1k/4k at 16k tokens -> OUTDIR/prepass_probe_tests.txt, prepass_probe.txt
#   heavy_first  the causal backwards' block order (HEAVY_FIRST: every head's key block 0 first) off and on: its GPU tests,
#                the half backward at d = 128 (N 1k/2k/4k, twice, alternating; forward + backward timed) and the 3xTF32
#                backward alone (tf32_bwd_sweep rows default-hf0 / default-hf1, N 1k/4k) -> OUTDIR/heavy_first_tests.txt,
#                heavy_first_{off,on}_{1,2}.json/.log, heavy_first_tf32.json/.log
#   red2_causal  the half backward's dQ atomics two columns at a time (RED2) off and on, twice, alternating, default
#                tilings, d = 128, N 1k/2k/4k, causal and not (forward + backward timed; the policy left causal d > 64
#                on scalar adds until LSE_P), after the half backward's GPU tests -> OUTDIR/red2_tests.txt,
#                red2_off_1.json/.log, red2_on_1, _off_2, _on_2
#   heavy_fwd    the 3xTF32 forward's causal block order (HEAVY_FIRST: every head's last query block first) off and on:
#                its GPU tests and the GPU case of the fast backward's HEAD_SUMS test (not rerun since its fix), then the
#                causal forward at d = 128 (the 4 x 1 x 32 default and 8 x 2 x 16, each per head and heavy first) and d = 64
#                (default, per head and heavy first), N 1k/2k/4k/8k/16k (the performance log's section "3xTF32 forward: the
#                heaviest query blocks of all heads first") -> OUTDIR/heavy_fwd_tests.txt, heavy_fwd_d128.json/.log, _d64
#   dq_unroll    the 3xTF32 backward's line 15 two or four k steps a pass (DQ_UNROLL): its GPU tests, then the backward
#                alone at the default tilings with DQ_UNROLL 1, 2, 4 (tf32_bwd_sweep rows default-dqu1/2/4), N 1k/4k/16k,
#                d 64/128, causal and not, two rounds in one process (compiled once; the performance log's section "3xTF32
#                backward: the dQ product's k steps in pairs") -> OUTDIR/dq_unroll_tests.txt, dq_unroll.json/.log
#   heavy_fwd_4k the 3xTF32 forward's causal d = 128 default (4 x 1 x 32) per head and heavy first at N = 4096, two runs
#                (the first with SDPA beside): the cell the H100 grid of 727c316 left at 1.00x -> OUTDIR/heavy_fwd_4k_{1,2}.json/.log
#   load_async   the 3xTF32 kernels' one-time tiles by cp.async (the forward's Q_i: Q_ASYNC; the backward's K_j, V_j:
#                KV_ASYNC): their GPU tests and those of the cp.async paths beside them, then the forward at the default
#                tilings with Q_i through registers and by cp.async (fa2_sweep tc-cp-q0 / tc-cp-q1, N 512/1k/4k/16k, d 128
#                and 64, causal and not, SDPA beside), then the backward alone with K_j, V_j each way (tf32_bwd_sweep rows
#                default-kv0 / default-kv1, N 1k/4k, d 128 and 64, two rounds in one process; the performance log's section
#                "The 3xTF32 kernels' one-time tiles by cp.async") -> OUTDIR/load_async_tests.txt, q_async_d128.json/.log,
#                q_async_d64.json/.log, kv_async.json/.log
#   tiles_4x2x16 the 3xTF32 forward at d = 128: its default tilings against 4 warps of MW = 2 with Bc = 16 (fa2_sweep tc /
#                tc-cp-4x2x16, N 512 to 8k, causal and not, SDPA beside; a second round without the baselines, in a new
#                process over the cached kernels; the performance log's section "The d = 128 forward in blocks of 128
#                rows") -> OUTDIR/tiles_4x2x16_{1,2}.json/.log
#   warp_skip    the 3xTF32 forward's causal warps that skip the key blocks none of their rows sees (WARP_SKIP): the
#                default tilings with it off and on (fa2_sweep tc-ws0 / tc-ws1, causal, N 512 to 16k, d 128 and 64, SDPA
#                beside in the first round, a second round without) -> OUTDIR/warp_skip_d{128,64}_{1,2}.json/.log
#   warp_skip_tests  its GPU tests, with those of the causal default tilings, the key-block order, STAGE_O_STEP and the
#                cp.async forward -> OUTDIR/warp_skip_tests.txt
#   split_kv     the 3xTF32 forward's K_j, V_j split into tf32 parts once per block in SRAM (SPLIT_KV) against by every
#                warp: the default tilings (fa2_sweep tc-skv0 / tc-skv1, d 128, N 512 to 16k, causal and not) and, causal,
#                8 x 2 x 16 with it (tc-cp-8x2x16-skv1); SDPA beside in the first round, a second round without; then its
#                GPU tests with WIDE's and the cp.async forward's -> OUTDIR/split_kv_{noncausal,causal}_{1,2}.json/.log,
#                split_kv_tests.txt
#   split_kv_ab  SPLIT_KV off and on again, timed in interleaved rounds (fa2_sweep --interleave: the first run at
#                607c685 timed them one after another, and identical kernels differed by position), d 128, N 512 to 16k,
#                not causal, and causal from 4k (8 x 2 x 16), SDPA beside in the first round; then the GPU tests of
#                SPLIT_KV, WIDE and the cp.async forward -> OUTDIR/split_kv_ab_{noncausal,causal}_{1,2}.json/.log,
#                split_kv_ab_tests.txt
#   split_qdo    the 3xTF32 backward's SPLIT_QDO (Q_i, dO_i split once per step in SRAM): its GPU tests, then the d = 128
#                backward alone with it off and on, N 1k/4k/16k, causal and not, two rotating rounds (tf32_bwd_sweep
#                default-sq0 default-sq1) -> OUTDIR/split_qdo_tests.txt, split_qdo.json/.log
#   split_stores the split passes' 16-byte stores (K_j's, Q_i's, dO_i's parts, and V_j's pairs from rows r, r + 4 copied by
#                one thread): GPU tests of SPLIT_KV and SPLIT_QDO, then the d = 128 forward's SPLIT_KV off / on
#                interleaved (N 512/1k/4k/16k not causal, 4k/16k causal) and the backward's SPLIT_QDO off / on (N 1k/4k, one
#                round) -> OUTDIR/split_stores_tests.txt, split_stores_{noncausal,causal,bwd}.json/.log
#   warp_skip_ab the causal d = 128 forward's WARP_SKIP off and on, 30 interleaved rounds, twice, N 512 to 4k (the decision of
#                2026-11-27 was timed one variant after the other; run 2026-11-28 at 484abb0 as this loop, then written here)
#                -> OUTDIR/warp_skip_ab_d128_{1,2}.json/.log
#   warp_skip_h200  WARP_SKIP off and on at the two causal d = 128 cells below SDPA (N 512 / 1k, both 4 x 2 x 16), 10
#                back-to-back calls a timing, 15 timings interleaved with SDPA, twice -> OUTDIR/warp_skip_h200_{1,2}.json/.log
#   suite_rest   the GPU suite's files that the cut runs at 50079fe did not reach (9 of tests/kernels) or reached last
#                (test_torch_compile, test_traceability, test_tutorials), 12 workers -> OUTDIR/gpu_suite_rest.log
#   ncu_split_kv Nsight Compute (--set full) of the d = 128 forward at N = 4k, b 4, h 16, with SPLIT_KV off and on, causal
#                and not (the default tiling there, 8 x 2 x 16; bench.ncu's spec "features") -> OUTDIR/ncu_split_kv{0,1}_{causal,
#                noncausal}_fwd_d128.txt: why it gains with causal and not without (the performance log's SPLIT_KV outcome)
#   tiles_causal_skv  the causal d = 128 forward's three tilings again, interleaved, now that 8 x 2 x 16 has SPLIT_KV with
#                16-byte stores (it ran 0.87-1.01x the default below 4k with 4-byte stores, timed one after another):
#                4 x 1 x 32, 4 x 2 x 16 and 8 x 2 x 16 (fa2_sweep tc-cp-4x1x32-wide, tc-cp-4x2x16, tc-cp-8x2x16-skv1), N 512 to
#                4k, 30 rounds, the order rotated in the second run, SDPA beside in the first
#                -> OUTDIR/tiles_causal_skv_{1,2}.json/.log
#   qdo_pairs    the 3xTF32 backward's QDO_PAIRS (SPLIT_QDO's parts as A-fragment quads of row pairs): the
#                GPU run of the test files of SPLIT_QDO and of the split passes (all their tests, each named), then the
#                d = 128 backward alone with SPLIT_QDO off, on, and on with QDO_PAIRS, N 1k/4k/16k, causal and not, two
#                rotating rounds (tf32_bwd_sweep default-sq0 default-sq1 default-sq1-pairs) -> OUTDIR/qdo_pairs_tests.txt,
#                qdo_pairs.json/.log
#   qdo_pairs_long the same GPU tests (run on 2026-11-28, 5cae1b0: 3 failures, named), then the sweep at N 8k / 16k
#                -> OUTDIR/qdo_pairs_tests.txt, qdo_pairs_long.json/.log
#   pairs_default SPLIT_QDO with QDO_PAIRS the default from 1k rows: the GPU run of the test files of SPLIT_QDO, the split
#                passes and the Q_i loader (all their tests, each named; the simulator-sized ones too)
#                -> OUTDIR/pairs_default_tests.txt
#   short_cells  the three d = 128 forward cells below SDPA in the H200 grid at 5e63e8d (N 512, causal 512 and 1k): Nsight
#                Compute's full set at N 512 (b 32, h 16: the grid's shape), causal and not, default tiling, to show where a
#                short block's time goes (prologue, key steps, epilogue) -> OUTDIR/ncu_short_{causal,noncausal}_fwd_d128.txt
#                (and _meta.json); then the causal tilings 4 x 1 x 32 and 4 x 2 x 16 at N 512 / 1k, 30 interleaved rounds
#                with SDPA, twice, the order rotated -> OUTDIR/short_causal_{1,2}.json/.log
#   nan_cap      the GPU tests of the fast backwards' NaN-keeping cap (_regtile.min_keep_nan) and of the causal d = 128
#                forward's 4 x 2 x 16 from N 512: test_edge_values.py, test_backward_kernels.py, test_tf32_backward_split_qdo.py,
#                test_key_block_order.py, test_tc_forward_cp_async.py -> OUTDIR/nan_cap_tests.txt; then bench.nan_reach ->
#                OUTDIR/nan_reach.txt
#   nan_stats    bench.nan_reach (now with the 3xTF32 forward's m, l, L of the NaN row) and the NaN tests (-k nan) of
#                test_edge_values.py, test_backward_kernels.py, test_tf32_backward_split_qdo.py, test_tf32_backward_cp_async.py,
#                (run at 51ae00a, where row_stats kept a NaN l; reverted since) -> OUTDIR/nan_reach.txt, nan_stats_tests.txt
#   d64_check    after the 3xTF32 backward's cap became min.NaN.f32 as PTX (_mma.min_nan_asm): its GPU test, then the d = 64
#                backward and training step at N 1k against SDPA (the grid at f42a8df had the non-causal d = 64 step 14-17 %
#                slower with the select) -> OUTDIR/d64_check_tests.txt, d64_check.json/.log
#   short_512    the default d = 128 forward at N 512, causal and not, 30 rounds interleaved with SDPA, twice (the grid's
#                non-causal 512 cell had rounds 7.6 % apart, median to min) -> OUTDIR/short_512_{1,2}.json/.log
#   short_queued the default d = 128 forward at N 512 and 1k, causal and not, interleaved with SDPA, each timing 10 back-to-back
#                calls (fa2_sweep --calls 10: the kernels' time, the host's work before a launch hidden behind the queue),
#                twice -> OUTDIR/short_queued_{1,2}.json/.log
#   nan_split    the 3xTF32 backward's NaN-keeping split of Q_i tau log2 e (_mma.make_split_keep_nan): the NaN and split
#                tests of test_mma.py, test_edge_values.py and test_tf32_backward_split_qdo.py, bench.nan_reach, then the
#                same three tests with the split's clamp taken out (a GPU mutant: they must fail)
#                -> OUTDIR/nan_split_tests.txt, nan_reach.txt, nan_split_mutant.txt
#   rescale_fma  the 3xTF32 forward's RESCALE_FMA (line 10's rescale of O in the first 8-key step's add, one FFMA): its GPU
#                tests and STAGE_O_STEP's, then the d = 128 default tilings with it off and on, N 512 / 1k / 4k, causal
#                and not, 10 back-to-back calls a timing, 15 timings interleaved with SDPA, twice (fa2_sweep tc-fma0 tc-fma1)
#                -> OUTDIR/rescale_fma_tests.txt, rescale_fma_{1,2}.json/.log
#   rescale_fma_long RESCALE_FMA off and on at the causal d = 128 tiling from 2k (8 x 2 x 16), N 2k / 8k / 16k, 3 back-to-back
#                calls a timing, 8 timings interleaved, no baselines or accuracy check (the GPU tests of rescale_fma check it), one run
#                -> OUTDIR/rescale_fma_long.json/.log
#   ncu_sdpa_short Nsight Compute's full set on torch SDPA's memory-efficient forward and on ours (the 3xTF32 forward's
#                default tiling, 4 x 2 x 16) at the grid's causal d = 128 cell N 512 (b 32, h 16), in one call, so that the
#                two kernels' launch statistics (grid, block, registers, SRAM), occupancy, issue slots and warp stalls
#                sit side by side -> OUTDIR/ncu_sdpa_causal_fwd_d128_n512.txt, ncu_ours_causal_fwd_d128_n512.txt (and _meta.json)
#   timeline_f32 python -m bench.host_layers --timeline --dtype float32 (the fa2 grid's causal forward at N 512, d = 64 and
#                128, and a causal d = 128 training step at N 1k: one synchronized call event by event, ours and SDPA
#                memory-efficient's), then --profile --dtype float32 --headdim 128 (a cProfile by own time)
#                -> OUTDIR/timeline_f32.txt, host_profile_f32_d128.txt
#   ncu_src      Nsight Compute's source counters on the 3xTF32 forward's default at the grid's causal d = 128 cell N 512
#                (b 32, h 16): warp-state samples and executed instructions per SASS instruction, to place the kernel's
#                waits (SourceCounters, WarpStateStats, SchedulerStats) -> OUTDIR/ncu_src_causal_fwd_d128_n512.csv (the
#                source page, SASS), .txt (the sections), _meta.json
#   nan_reach    where a NaN in Q goes in the 3xTF32 backward, build by build (bench/nan_reach.py) -> OUTDIR/nan_reach.txt
#   half_bwd_cp  the half backward's tilings with and without cp.async for Q_i, dO_i (half_sweep --backward; the log's
#                section "FA2 backward in fp16 / bf16: cp.async for Q_i, dO_i") -> OUTDIR/half_bwd_cp.json/.log
# OUTDIR/pending_env.txt says what ran where. A failed step is noted and the rest run. Exit status: 0 when all ran.
set -uo pipefail
out="${1:-${OUT:-.}}"
shift $(( $# > 0 ? 1 : 0 ))
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(host)
mkdir -p "$out"
source bench/gpu/setup_env.sh > "$out/pending_env.txt" 2>&1 || { cat "$out/pending_env.txt"; exit 1; }
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit ${NUMBA_FLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}; steps: ${steps[*]}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
} >> "$out/pending_env.txt" 2>&1
rc=0
step() {  # step FILE COMMAND...: run, log to OUTDIR/FILE, note a failure and go on
  local name="$1"
  shift
  echo "+ $*" | tee "$out/$name"
  "$@" >> "$out/$name" 2>&1 || { echo "run_pending: '$*' failed (see $name)" >&2; rc=1; }
}
mutant() {  # mutant FILE SED_EXPR LOG TIMEOUT COMMAND...: a GPU mutation check: FILE edited by SED_EXPR (unchanged: noted
  # as a failure), COMMAND under TIMEOUT must fail (logged to OUTDIR/LOG by step), then FILE restored
  local file="$1" expr="$2" log="$3" limit="$4"
  shift 4
  cp "$file" "$out/mutant.orig"
  sed -i "$expr" "$file"
  if cmp -s "$file" "$out/mutant.orig"; then
    echo "run_pending: mutant '$expr' not applied to $file" >&2
    rc=1
  else
    step "$log" timeout "$limit" bash -c '! "$@"' _ "$@"
  fi
  cp "$out/mutant.orig" "$file" && rm "$out/mutant.orig"
}
ncu_found() {  # ncu_found: set ncu_bin to Nsight Compute's path (bench.ncu.find_ncu); none: note the failure, return 1
  ncu_bin="$(python3 -c 'from bench.ncu import find_ncu; print(find_ncu() or "")')"
  [ -n "$ncu_bin" ] || { echo "run_pending: no ncu" >&2; rc=1; return 1; }
}
ncu_full() {  # ncu_full STEM SPEC [TIMEOUT]: Nsight Compute's full set (after ncu_found) on bench.ncu's case SPEC (JSON),
  # under TIMEOUT seconds if given -> OUTDIR/STEM.txt, OUTDIR/STEM_meta.json
  local stem="$1" spec="$2" limit=()
  [ -z "${3:-}" ] || limit=(timeout "$3")
  step "$stem.txt" "${limit[@]}" "$ncu_bin" --set full --nvtx --nvtx-include "numba_flash_measure/" --print-units base \
    python3 -m bench.ncu --child "$spec" --meta-out "$out/${stem}_meta.json"
}
backward_pairs() {  # backward_pairs STEM FEATURE TIMEOUT [HALF_SWEEP_ARGS...]: the half backward's default tiling
  # (forward + backward timed) with FEATURE false, true, false, true -> OUTDIR/STEM_{off,on}_{1,2}.json/.log
  local stem="$1" feature="$2" limit="$3" r mode flag
  shift 3
  for r in 1 2; do
    for mode in off on; do
      flag=false; [ "$mode" = on ] && flag=true
      step "${stem}_${mode}_$r.log" timeout "$limit" python3 -m bench.half_sweep --backward --default-only "$@" \
        --features "{\"$feature\": $flag}" --out "$out/${stem}_${mode}_$r.json"
    done
  done
}
fa2_rounds() {  # fa2_rounds STEM TIMEOUT FA2_SWEEP_ARGS...: bench.fa2_sweep with those arguments, twice, each under TIMEOUT
  # seconds -> OUTDIR/STEM_{1,2}.json/.log; then their forward rows
  local stem="$1" limit="$2" r
  shift 2
  for r in 1 2; do
    step "${stem}_$r.log" timeout "$limit" python3 -m bench.fa2_sweep "$@" --out "$out/${stem}_$r.json"
  done
  grep -h "^forward" "$out"/"$stem"_*.log
}
forward_pairs() {  # forward_pairs PREFIX OFF_JSON ON_JSON: the half forward's default tilings off, on, off, on (N 4k/16k)
  local prefix="$1" off="$2" on="$3" r
  for r in 1 2; do
    step "${prefix}_fwd_off_$r.log" timeout 100 python3 -m bench.half_sweep --seqlens 4096 16384 --default-only \
      --features "$off" --out "$out/${prefix}_fwd_off_$r.json"
    step "${prefix}_fwd_on_$r.log" timeout 100 python3 -m bench.half_sweep --seqlens 4096 16384 --default-only \
      --features "$on" --out "$out/${prefix}_fwd_on_$r.json"
  done
}
for s in "${steps[@]}"; do
  case "$s" in
    streams)
      step streams_gpu.txt python3 -m pytest -q -p no:cacheprovider -rfE tests/test_streams.py tests/kernels/test_half_backward_cp_async.py ;;
    host)
      step host_overhead_gpu.txt python3 -m bench.host_overhead --calls 500 --repeats 3
      step host_probe.txt python3 -m bench.short_seq_probe --host
      step profile.txt python3 -m bench.short_seq_probe --profile ;;
    tc_cp)
      step tc_cp_d64.log python3 -m bench.fa2_sweep --seqlens 1024 4096 16384 --headdims 64 \
        --variants tc tc-cp tc-cp-Bc32 tc-cp-NW8-MW1 --out "$out/tc_cp_d64.json"
      step tc_cp_d128.log python3 -m bench.fa2_sweep --seqlens 1024 4096 16384 --headdims 128 \
        --variants tc tc-cp tc-cp-64x32 --out "$out/tc_cp_d128.json"
      tail -n 25 "$out/tc_cp_d64.log" "$out/tc_cp_d128.log" ;;
    ncu_tc)
      ncu_found || continue
      for case in fwd:forward:128 fwd:forward:64 bwd:backward:128; do
        IFS=: read -r tag pass d <<< "$case"
        spec="{\"algorithm\":\"flash2\",\"variant\":\"tensorcore\",\"pass\":\"$pass\",\"batch\":4,\"nheads\":16,\"N\":4096,\"d\":$d}"
        ncu_full "ncu_tc_${tag}_d${d}" "$spec"
      done ;;
    ncu_causal)
      ncu_found || continue
      for case in causal:true:128,16 noncausal:false:256,16; do
        IFS=: read -r tag causal bs <<< "$case"
        spec="{\"algorithm\":\"flash2\",\"variant\":\"tensorcore\",\"pass\":\"forward\",\"batch\":16,\"nheads\":16,\"N\":1024,\"d\":128,\"causal\":$causal,\"block_sizes\":[$bs]}"
        ncu_full "ncu_${tag}_fwd_d128" "$spec" 240
      done ;;
    ncu_split_kv)
      ncu_found || continue
      for causal in true false; do
        for skv in 0 1; do
          tag="$([ "$causal" = true ] && echo causal || echo noncausal)"
          spec="{\"algorithm\":\"flash2\",\"variant\":\"tensorcore\",\"pass\":\"forward\",\"batch\":4,\"nheads\":16,\"N\":4096,\"d\":128,\"causal\":$causal,\"features\":{\"SPLIT_KV\":$([ "$skv" = 1 ] && echo true || echo false)}}"
          ncu_full "ncu_split_kv${skv}_${tag}_fwd_d128" "$spec" 240
        done
      done ;;
    ncu_half)
      ncu_found || continue
      for d in 128 64; do
        spec="{\"algorithm\":\"flash2\",\"variant\":\"tensorcore\",\"pass\":\"backward\",\"batch\":4,\"nheads\":16,\"N\":4096,\"d\":$d,\"dtype\":\"bfloat16\"}"
        ncu_full "ncu_half_bwd_d${d}" "$spec" 200
      done ;;
    half_ex2)
      step half_ex2_tests.txt python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_half_ex2_ftz.py
      step half_ex2_off.log python3 -m bench.half_sweep --seqlens 1024 4096 16384 --default-only --out "$out/half_ex2_off.json"
      step half_ex2_on.log python3 -m bench.half_sweep --seqlens 1024 4096 16384 --default-only --features '{"EX2_FTZ": true}' \
        --out "$out/half_ex2_on.json"
      step half_ex2_bwd_off.log python3 -m bench.half_sweep --backward --seqlens 1024 4096 --default-only --out "$out/half_ex2_bwd_off.json"
      step half_ex2_bwd_on.log python3 -m bench.half_sweep --backward --seqlens 1024 4096 --default-only --features '{"EX2_FTZ": true}' \
        --out "$out/half_ex2_bwd_on.json"
      tail -n 12 "$out/half_ex2_off.log" "$out/half_ex2_on.log" "$out/half_ex2_bwd_off.log" "$out/half_ex2_bwd_on.log" ;;
    half_ex2_pairs)
      f='{"EX2_FTZ": false}'
      t='{"EX2_FTZ": true}'
      forward_pairs ex2 "$f" "$t"
      step ex2_bwd_on.log timeout 110 python3 -m bench.half_sweep --backward --seqlens 4096 --default-only --features "$t" \
        --out "$out/ex2_bwd_on.json"
      step ex2_bwd_off.log timeout 100 python3 -m bench.half_sweep --backward --seqlens 4096 --default-only --features "$f" \
        --out "$out/ex2_bwd_off.json"
      for n in ex2_fwd_off_1 ex2_fwd_on_1 ex2_fwd_off_2 ex2_fwd_on_2 ex2_bwd_on ex2_bwd_off; do
        echo "== $n"; grep "^half" "$out/$n.log"
      done | tee "$out/ex2_pairs.txt" ;;
    ostep)
      step ostep_tests.txt python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_tc_stage_o_step.py
      step ostep_d128.log timeout 300 python3 -m bench.fa2_sweep --seqlens 4096 16384 --headdims 128 \
        --variants tc-cp tc-cp-ostep tc-cp-MW2-ostep tc-cp-NW8-MW2-Bc16-ostep --out "$out/ostep_d128.json"
      step ostep_d64.log timeout 120 python3 -m bench.fa2_sweep --seqlens 4096 --headdims 64 \
        --variants tc-cp tc-cp-ostep --no-baselines --out "$out/ostep_d64.json"
      tail -n 30 "$out/ostep_d128.log" "$out/ostep_d64.log" ;;
    short_d128)
      step short_d128.log timeout 200 python3 -m bench.fa2_sweep --seqlens 1024 2048 --headdims 128 \
        --variants tc-cp tc-cp-NW8-MW1-Bc32 --out "$out/short_d128.json"
      tail -n 20 "$out/short_d128.log" ;;
    short_causal)
      step short_causal_d64.log timeout 150 python3 -m bench.fa2_sweep --seqlens 1024 2048 --headdims 64 --causal yes \
        --variants tc-cp tc-cp-NW8-MW1 tc-cp-4x1x32 tc-cp-8x1x32 --out "$out/short_causal_d64.json"
      step short_causal_d128.log timeout 150 python3 -m bench.fa2_sweep --seqlens 1024 2048 --headdims 128 --causal yes \
        --variants tc-cp tc-cp-NW8-MW1-Bc32 tc-cp-64x32 --out "$out/short_causal_d128.json"
      tail -n 14 "$out/short_causal_d64.log" "$out/short_causal_d128.log" ;;
    causal_d128)
      step causal_d128.log timeout 200 python3 -m bench.fa2_sweep --seqlens 4096 8192 16384 --headdims 128 --causal yes \
        --variants tc-cp tc-cp-64x32 --no-baselines --out "$out/causal_d128.json"
      tail -n 10 "$out/causal_d128.log" ;;
    wide_d128)
      step wide_tests.txt python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_tc_wide.py
      step wide_d128.log timeout 330 python3 -m bench.fa2_sweep --seqlens 1024 4096 16384 --headdims 128 \
        --variants tc-cp tc-cp-wide tc-cp-8x1x32-wide tc-cp-8x2x16-wide --out "$out/wide_d128.json"
      step wide_d64.log timeout 200 python3 -m bench.fa2_sweep --seqlens 1024 4096 16384 --headdims 64 \
        --variants tc-cp tc-cp-wide --out "$out/wide_d64.json"
      tail -n 30 "$out/wide_d128.log"; tail -n 14 "$out/wide_d64.log" ;;
    heavy_fwd)
      step heavy_fwd_tests.txt python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_key_block_order.py \
        tests/kernels/test_fast_backward_head_sums.py
      step heavy_fwd_d128.log timeout 330 python3 -m bench.fa2_sweep --seqlens 1024 2048 4096 8192 16384 --headdims 128 \
        --causal yes --variants tc-cp-4x1x32-wide-perhead tc-cp-4x1x32-wide-hf tc-cp-8x2x16-wide-perhead tc-cp-8x2x16-wide-hf \
        --out "$out/heavy_fwd_d128.json"
      step heavy_fwd_d64.log timeout 180 python3 -m bench.fa2_sweep --seqlens 1024 2048 4096 8192 16384 --headdims 64 \
        --causal yes --variants tc-cp-perhead tc-cp-hf --out "$out/heavy_fwd_d64.json"
      tail -n 30 "$out/heavy_fwd_d128.log"; tail -n 16 "$out/heavy_fwd_d64.log" ;;
    dq_unroll)
      step dq_unroll_tests.txt python3 -m pytest -q -p no:cacheprovider -rfE -m gpu tests/kernels/test_tf32_backward_dq_unroll.py
      step dq_unroll.log timeout 450 python3 -m bench.tf32_bwd_sweep --seqlens 1024 4096 16384 --headdims 64 128 \
        --no-fwdbwd --rounds 2 --tilings default-dqu1 default-dqu2 default-dqu4 --out "$out/dq_unroll.json"
      grep "^bwd" "$out/dq_unroll.log" ;;
    load_async)
      step load_async_tests.txt python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_tc_forward_q_async.py \
        tests/kernels/test_tf32_backward_kv_async.py tests/kernels/test_tc_forward_cp_async.py::test_cp_async_pipeline_equals_the_register_path_on_gpu_shapes \
        tests/kernels/test_tf32_backward_cp_async.py::test_cp_async_stages_give_the_register_paths_gradients_on_gpu_shapes
      for d in 128 64; do
        step "q_async_d$d.log" timeout 200 python3 -m bench.fa2_sweep --seqlens 512 1024 4096 16384 --headdims "$d" \
          --variants tc-cp-q0 tc-cp-q1 --repeats 20 --out "$out/q_async_d$d.json"
      done
      step kv_async.log timeout 330 python3 -m bench.tf32_bwd_sweep --seqlens 1024 4096 --headdims 128 64 \
        --no-fwdbwd --rounds 2 --tilings default-kv0 default-kv1 --out "$out/kv_async.json"
      grep "^bwd" "$out/kv_async.log" ;;
    split_kv)
      for r in 1 2; do
        step "split_kv_noncausal_$r.log" timeout 240 python3 -m bench.fa2_sweep --seqlens 512 1024 2048 4096 8192 16384 --headdims 128 \
          --causal no --variants tc-skv0 tc-skv1 --repeats 20 $([ "$r" = 2 ] && echo --no-check --no-baselines) \
          --out "$out/split_kv_noncausal_$r.json"
        step "split_kv_causal_$r.log" timeout 240 python3 -m bench.fa2_sweep --seqlens 512 1024 2048 4096 8192 16384 --headdims 128 \
          --causal yes --variants tc-skv0 tc-skv1 tc-cp-8x2x16-skv1 --repeats 20 $([ "$r" = 2 ] && echo --no-check --no-baselines) \
          --out "$out/split_kv_causal_$r.json"
      done
      for r in 1 2; do grep "^forward" "$out/split_kv_noncausal_$r.log" "$out/split_kv_causal_$r.log"; done
      step split_kv_tests.txt timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE -n 8 -m gpu tests/kernels/test_tc_forward_split_kv.py \
        tests/kernels/test_tc_wide.py tests/kernels/test_tc_forward_cp_async.py ;;
    split_kv_ab)
      for r in 1 2; do
        step "split_kv_ab_noncausal_$r.log" timeout 200 python3 -m bench.fa2_sweep --seqlens 512 1024 2048 4096 8192 16384 --headdims 128 \
          --causal no --variants tc-skv0 tc-skv1 --repeats 30 --interleave --no-check $([ "$r" = 2 ] && echo --no-baselines) \
          --out "$out/split_kv_ab_noncausal_$r.json"
        step "split_kv_ab_causal_$r.log" timeout 150 python3 -m bench.fa2_sweep --seqlens 4096 8192 16384 --headdims 128 \
          --causal yes --variants tc-skv0 tc-skv1 --repeats 30 --interleave --no-check $([ "$r" = 2 ] && echo --no-baselines) \
          --out "$out/split_kv_ab_causal_$r.json"
      done
      for r in 1 2; do grep "^forward" "$out/split_kv_ab_noncausal_$r.log" "$out/split_kv_ab_causal_$r.log"; done
      step split_kv_ab_tests.txt timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE -n 8 -m gpu tests/kernels/test_tc_forward_split_kv.py \
        tests/kernels/test_tc_wide.py tests/kernels/test_tc_forward_cp_async.py ;;
    split_stores)
      step split_stores_tests.txt timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE -n 8 -m gpu tests/kernels/test_tc_forward_split_kv.py \
        tests/kernels/test_tf32_backward_split_qdo.py
      step split_stores_noncausal.log timeout 150 python3 -m bench.fa2_sweep --seqlens 512 1024 4096 16384 --headdims 128 \
        --causal no --variants tc-skv0 tc-skv1 --repeats 20 --interleave --no-check --out "$out/split_stores_noncausal.json"
      # (the second round, run on 2026-11-28 in its own call, as this line: the order reversed)
      step split_stores_noncausal_2.log timeout 130 python3 -m bench.fa2_sweep --seqlens 512 1024 4096 16384 --headdims 128 \
        --causal no --variants tc-skv1 tc-skv0 --repeats 20 --interleave --no-check --no-baselines --out "$out/split_stores_noncausal_2.json"
      step split_stores_causal.log timeout 120 python3 -m bench.fa2_sweep --seqlens 4096 16384 --headdims 128 \
        --causal yes --variants tc-skv0 tc-skv1 --repeats 20 --interleave --no-check --no-baselines --out "$out/split_stores_causal.json"
      step split_stores_bwd.log timeout 330 python3 -m bench.tf32_bwd_sweep --seqlens 1024 4096 --headdims 128 \
        --no-fwdbwd --rounds 1 --tilings default-sq0 default-sq1 --out "$out/split_stores_bwd.json"
      grep -h "^forward\|^bwd" "$out"/split_stores_*.log ;;
    warp_skip_ab)
      for r in 1 2; do
        step "warp_skip_ab_d128_$r.log" timeout 200 python3 -m bench.fa2_sweep --seqlens 512 1024 2048 4096 --headdims 128 --causal yes \
          --variants tc-ws0 tc-ws1 --repeats 30 --interleave --no-check $([ "$r" = 2 ] && echo --no-baselines) --out "$out/warp_skip_ab_d128_$r.json"
      done
      grep -h "^forward" "$out"/warp_skip_ab_d128_*.log ;;
    warp_skip_h200)
      fa2_rounds warp_skip_h200 150 --seqlens 512 1024 --headdims 128 --causal yes --variants tc-ws0 tc-ws1 \
        --repeats 15 --calls 10 --interleave ;;
    suite_rest)
      step gpu_suite_rest.log timeout "${NUMBA_FLASH_SUITE_REST_S:-400}" python3 -m pytest -n "${NUMBA_FLASH_SUITE_WORKERS:-12}" -v -rfEX \
        -p no:cacheprovider --durations=10 tests/kernels/test_fa2_kernels.py tests/kernels/test_half_ex2_ftz.py \
        tests/kernels/test_half_red2.py tests/kernels/test_tf32_backward.py tests/kernels/test_tf32_backward_cp_async.py \
        tests/kernels/test_tf32_backward_dq_unroll.py tests/kernels/test_tf32_backward_kv_async.py \
        tests/kernels/test_tf32_backward_split_qdo.py tests/kernels/test_tf32_backward_wide.py tests/test_torch_compile.py \
        tests/test_traceability.py tests/test_tutorials.py
      tail -n 15 "$out/gpu_suite_rest.log" ;;
    split_qdo)
      step split_qdo_tests.txt timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 -m gpu tests/kernels/test_tf32_backward_split_qdo.py
      step split_qdo.log timeout 330 python3 -m bench.tf32_bwd_sweep --seqlens 1024 4096 16384 --headdims 128 \
        --no-fwdbwd --rounds 2 --tilings default-sq0 default-sq1 --out "$out/split_qdo.json"
      grep "^bwd" "$out/split_qdo.log" ;;
    warp_skip)
      for r in 1 2; do
        for d in 128 64; do
          step "warp_skip_d${d}_$r.log" timeout 200 python3 -m bench.fa2_sweep --seqlens 512 1024 2048 4096 8192 16384 --headdims "$d" \
            --causal yes --variants tc-ws0 tc-ws1 --repeats 20 $([ "$r" = 2 ] && echo --no-check --no-baselines) \
            --out "$out/warp_skip_d${d}_$r.json"
        done
      done
      for r in 1 2; do grep "^forward" "$out/warp_skip_d128_$r.log" "$out/warp_skip_d64_$r.log"; done ;;
    warp_skip_tests)  # its GPU tests and those of the causal defaults beside it
      step warp_skip_tests.txt timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 -m gpu tests/kernels/test_tc_forward_warp_skip.py \
        tests/kernels/test_key_block_order.py tests/kernels/test_tc_stage_o_step.py tests/kernels/test_tc_forward_cp_async.py ;;
    tiles_4x2x16)
      for r in 1 2; do
        step "tiles_4x2x16_$r.log" timeout 330 python3 -m bench.fa2_sweep --seqlens 512 1024 2048 4096 8192 --headdims 128 \
          --variants tc tc-cp-4x2x16 --repeats 20 $([ "$r" = 2 ] && echo --no-check --no-baselines) \
          --out "$out/tiles_4x2x16_$r.json"
      done
      tail -n 30 "$out/tiles_4x2x16_1.log" "$out/tiles_4x2x16_2.log" ;;
    heavy_fwd_4k)
      for r in 1 2; do
        step "heavy_fwd_4k_$r.log" timeout 120 python3 -m bench.fa2_sweep --seqlens 4096 --headdims 128 --causal yes \
          --variants tc-cp-4x1x32-wide-perhead tc-cp-4x1x32-wide-hf --no-check $([ "$r" = 2 ] && echo --no-baselines) \
          --out "$out/heavy_fwd_4k_$r.json"
      done
      tail -n 8 "$out/heavy_fwd_4k_1.log" "$out/heavy_fwd_4k_2.log" ;;
    wide_bwd)
      step wide_bwd_tests.txt python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_tf32_backward_wide.py \
        tests/kernels/test_tc_wide.py
      step wide_bwd.log timeout 330 python3 -m bench.tf32_bwd_sweep --seqlens 1024 4096 16384 --headdims 64 128 --no-fwdbwd \
        --tilings default-nowide default-wide 8x1-Br32-cp-wide --out "$out/wide_bwd.json"
      tail -n 40 "$out/wide_bwd.log" ;;
    occ3_d128)
      step occ3_tests.txt python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_tc_stage_o_step.py
      step occ3_d128.log timeout 300 python3 -m bench.fa2_sweep --seqlens 1024 4096 16384 --headdims 128 \
        --variants tc-cp tc-cp-4x1x16-ostep tc-cp-64x32 --out "$out/occ3_d128.json"
      tail -n 24 "$out/occ3_d128.log" ;;
    host_layers)
      step host_layers.txt python3 -m bench.host_layers
      step host_profile.txt python3 -m bench.host_layers --profile
      grep -E " api| run | module|smem-launch" "$out/host_layers.txt" ;;
    short_direct)  # the baseline tree: NUMBA_FLASH_BASELINE_TREE, a checkout of an earlier commit (git archive SHA | tar -x -C DIR)
      base="${NUMBA_FLASH_BASELINE_TREE:-}"
      sel='bfloat16 and (512 or 1024 or 2048)'
      if [ -n "$base" ]; then
        python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/nf-baseline-site "$base" >/dev/null
        step short_direct_base.log env PYTHONPATH="/tmp/nf-baseline-site:$PYTHONPATH" bash -c "cd '$base' && python3 -m pytest \
          tests/benchmarks/test_bench_half.py -k 'flash2 and $sel' -q -p no:xdist -p no:cacheprovider --benchmark-enable \
          --benchmark-json='$(realpath "$out")/short_direct_base.json' --benchmark-columns=median,rounds --benchmark-sort=name"
      fi
      step short_direct.log python3 -m pytest tests/benchmarks/test_bench_half.py -k "(flash2 or sdpa_mem_efficient or sdpa_flash) and $sel" \
        -q -p no:xdist -p no:cacheprovider --benchmark-enable --benchmark-json="$out/short_direct.json" \
        --benchmark-columns=median,rounds --benchmark-sort=name
      grep -h "test_bench" "$out"/short_direct*.log | sort ;;
    short_replay)
      step replay_tests.txt python3 -m pytest -q -p no:cacheprovider -rfE tests/test_replay.py
      sel='bfloat16 and (512 or 1024 or 2048)'
      for mode in off on; do
        flag=0; [ "$mode" = on ] && flag=1
        step "short_replay_$mode.log" env NUMBA_FLASH_REPLAY=$flag python3 -m pytest tests/benchmarks/test_bench_half.py \
          -k "(flash2 or sdpa_mem_efficient) and $sel" -q -p no:xdist -p no:cacheprovider --benchmark-enable \
          --benchmark-json="$out/short_replay_$mode.json" --benchmark-columns=median,rounds --benchmark-sort=name
      done
      grep -h "test_bench.*flash2" "$out"/short_replay_*.log | sort ;;
    host_kernels)
      step host_kernels.txt timeout 300 python3 -m bench.host_layers --kernels
      grep "ms/step" "$out/host_kernels.txt" ;;
    timeline)
      step timeline.txt timeout 300 python3 -m bench.host_layers --timeline
      grep "^##\|profiled call" "$out/timeline.txt" ;;
    host_kernels_ab)  # the baseline tree: NUMBA_FLASH_BASELINE_TREE (git archive SHA | tar -x -C DIR), as short_direct
      base="${NUMBA_FLASH_BASELINE_TREE:?host_kernels_ab needs NUMBA_FLASH_BASELINE_TREE}"
      python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/nf-baseline-site "$base" >/dev/null
      for r in 1 2; do
        step "host_kernels_base_$r.txt" env PYTHONPATH="/tmp/nf-baseline-site:$PYTHONPATH" \
          NUMBA_FLASH_COMMIT="${NUMBA_FLASH_BASELINE_COMMIT:-the baseline tree}" bash -c \
          "cd '$base' && timeout 300 python3 -m bench.host_layers --kernels"
        step "host_kernels_new_$r.txt" timeout 300 python3 -m bench.host_layers --kernels
      done
      grep -H "ms/step" "$out"/host_kernels_{base,new}_*.txt | grep -v "ours  " ;;
    heavy_first_d64)
      for i in 1 2; do
        step "heavy_first_d64_$i.log" timeout 200 python3 -m bench.tf32_bwd_sweep --headdims 64 --seqlens 1024 2048 4096 \
          --no-fwdbwd --tilings default-hf0 default-hf1 --out "$out/heavy_first_d64_$i.json"
      done
      grep -h "^bwd" "$out"/heavy_first_d64_*.log ;;
    short_kernels)
      step short_kernels.log timeout 400 python3 -m bench.half_sweep --seqlens 512 1024 2048 --calls 10 --repeats 10 \
        --out "$out/short_kernels.json"
      tail -n 40 "$out/short_kernels.log" ;;
    lse_p)
      step lse_p_tests.txt timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_half_lse_p.py
      backward_pairs lse_p LSE_P 110 --seqlens 1024 2048 4096
      grep -h "^half" "$out"/lse_p_*.log | sort ;;
    prepass)
      step prepass_tests.txt timeout 420 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/test_fast_prepass.py \
        tests/kernels/test_tf32_backward.py tests/kernels/test_half_lse_p.py tests/test_replay.py tests/kernels/test_backward_kernels.py \
        tests/kernels/test_fa2_kernels.py
      tail -n 3 "$out/prepass_tests.txt" ;;
    prepass_probe)
      step prepass_probe_tests.txt timeout 200 python3 -m pytest -q -n 4 -p no:cacheprovider -rfE tests/kernels/test_fast_prepass.py
      tail -n 2 "$out/prepass_probe_tests.txt"
      step prepass_probe.txt timeout 240 python3 -m bench.prepass_probe
      cat "$out/prepass_probe.txt" ;;
    heavy_first)
      step heavy_first_tests.txt timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/test_key_block_order.py \
        tests/kernels/test_half_red2.py tests/kernels/test_tf32_backward.py tests/kernels/test_launch_limits.py
      tail -n 2 "$out/heavy_first_tests.txt"
      backward_pairs heavy_first HEAVY_FIRST 80 --headdims 128 --seqlens 1024 2048 4096
      step heavy_first_tf32.log timeout 150 python3 -m bench.tf32_bwd_sweep --headdims 128 --seqlens 1024 4096 --no-fwdbwd \
        --tilings default-hf0 default-hf1 --out "$out/heavy_first_tf32.json"
      grep -h "^half" "$out"/heavy_first_*.log | sort; grep "^bwd" "$out/heavy_first_tf32.log" ;;
    red2_causal)
      step red2_tests.txt timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/kernels/test_half_red2.py \
        tests/kernels/test_half_backward_cp_async.py tests/kernels/test_half_kernels.py -m gpu
      tail -n 3 "$out/red2_tests.txt"
      backward_pairs red2 RED2 100 --headdims 128 --seqlens 1024 2048 4096
      grep -h "^half" "$out"/red2_*.log | sort ;;
    tiles_causal_skv)
      for r in 1 2; do
        if [ "$r" = 1 ]; then v="tc-cp-4x1x32-wide tc-cp-4x2x16 tc-cp-8x2x16-skv1"; else v="tc-cp-8x2x16-skv1 tc-cp-4x1x32-wide tc-cp-4x2x16"; fi
        # shellcheck disable=SC2086
        step "tiles_causal_skv_$r.log" timeout 240 python3 -m bench.fa2_sweep --seqlens 512 1024 2048 4096 --headdims 128 --causal yes \
          --variants $v --repeats 30 --interleave --no-check $([ "$r" = 2 ] && echo --no-baselines) --out "$out/tiles_causal_skv_$r.json"
      done
      grep -h "^forward" "$out"/tiles_causal_skv_*.log ;;
    qdo_pairs)  # run on 2026-11-28 (8da26c3) with the sweep first (300 s: cut in its 16k rounds) and the tests after it
      # (110 s: cut with 3 failures in 32 results, before pytest named them): now the tests first, each named (-v)
      step qdo_pairs_tests.txt timeout 240 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 tests/kernels/test_tf32_backward_split_qdo.py \
        tests/kernels/test_tc_forward_split_kv.py
      step qdo_pairs.log timeout 330 python3 -m bench.tf32_bwd_sweep --seqlens 1024 4096 16384 --headdims 128 \
        --no-fwdbwd --rounds 2 --tilings default-sq0 default-sq1 default-sq1-pairs --out "$out/qdo_pairs.json"
      grep "^bwd" "$out/qdo_pairs.log" ;;
    qdo_pairs_long)  # run on 2026-11-28 (5cae1b0) by hand as these commands (timeouts 220 and 300)
      step qdo_pairs_tests.txt timeout 220 python3 -m pytest -v -p no:cacheprovider -rfE -n 8 tests/kernels/test_tf32_backward_split_qdo.py \
        tests/kernels/test_tc_forward_split_kv.py
      step qdo_pairs_long.log timeout 300 python3 -m bench.tf32_bwd_sweep --seqlens 8192 16384 --headdims 128 \
        --no-fwdbwd --rounds 2 --tilings default-sq0 default-sq1 default-sq1-pairs --out "$out/qdo_pairs_long.json"
      grep "^bwd" "$out/qdo_pairs_long.log" ;;
    pairs_default)
      step pairs_default_tests.txt timeout 400 python3 -m pytest -v -p no:cacheprovider -rfE --tb=short -n 8 \
        tests/kernels/test_tf32_backward_split_qdo.py tests/kernels/test_tc_forward_split_kv.py tests/kernels/test_scaled_q_loader.py
      tail -n 60 "$out/pairs_default_tests.txt" ;;
    short_cells)
      if ncu_found; then
        for causal in true false; do
          tag="$([ "$causal" = true ] && echo causal || echo noncausal)"
          spec="{\"algorithm\":\"flash2\",\"variant\":\"tensorcore\",\"pass\":\"forward\",\"batch\":32,\"nheads\":16,\"N\":512,\"d\":128,\"causal\":$causal}"
          ncu_full "ncu_short_${tag}_fwd_d128" "$spec" 200
        done
      fi
      for r in 1 2; do
        if [ "$r" = 1 ]; then v="tc-cp-4x1x32-wide tc-cp-4x2x16"; else v="tc-cp-4x2x16 tc-cp-4x1x32-wide"; fi
        # shellcheck disable=SC2086
        step "short_causal_$r.log" timeout 150 python3 -m bench.fa2_sweep --seqlens 512 1024 --headdims 128 --causal yes \
          --variants $v --repeats 30 --interleave --no-check --out "$out/short_causal_$r.json"
      done
      grep -h "^forward" "$out"/short_causal_*.log ;;
    nan_cap)
      step nan_cap_tests.txt timeout 360 python3 -m pytest -v -p no:cacheprovider -rfE --tb=short -n 8 tests/test_edge_values.py \
        tests/kernels/test_backward_kernels.py tests/kernels/test_tf32_backward_split_qdo.py tests/kernels/test_key_block_order.py \
        tests/kernels/test_tc_forward_cp_async.py
      tail -n 30 "$out/nan_cap_tests.txt"
      step nan_reach.txt timeout 200 python3 -m bench.nan_reach
      cat "$out/nan_reach.txt" ;;
    nan_stats)
      step nan_reach.txt timeout 150 python3 -m bench.nan_reach
      grep -v -i warn "$out/nan_reach.txt"
      step nan_stats_tests.txt timeout 200 python3 -m pytest -v -p no:cacheprovider -rfE --tb=short -n 8 -k nan \
        tests/test_edge_values.py tests/kernels/test_backward_kernels.py tests/kernels/test_tf32_backward_split_qdo.py \
        tests/kernels/test_tf32_backward_cp_async.py
      grep -E "FAILED|passed|failed" "$out/nan_stats_tests.txt" | tail -n 20 ;;
    d64_check)
      step d64_check_tests.txt timeout 60 python3 -m pytest -v -p no:cacheprovider -rfE --tb=short -k cap tests/kernels/test_backward_kernels.py
      grep -E "passed|failed" "$out/d64_check_tests.txt" | tail -n 3
      step d64_check.log timeout 130 python3 -m bench.tf32_bwd_sweep --seqlens 1024 --headdims 64 --tilings default --repeats 10 \
        --out "$out/d64_check.json"
      grep -E "fwd\+bwd|backward" "$out/d64_check.log" | tail -n 12 ;;
    short_512)
      fa2_rounds short_512 120 --seqlens 512 --headdims 128 --causal both --variants tc --repeats 30 --interleave --no-check ;;
    short_queued)
      fa2_rounds short_queued 150 --seqlens 512 1024 --headdims 128 --causal both --variants tc --repeats 20 --calls 10 \
        --interleave --no-check ;;
    nan_split)
      step nan_split_tests.txt timeout 240 python3 -m pytest -v -p no:cacheprovider -rfE --tb=short -n 8 -k "nan or split" \
        tests/kernels/test_mma.py tests/test_edge_values.py tests/kernels/test_tf32_backward_split_qdo.py
      grep -E "FAILED|XPASS|passed|failed" "$out/nan_split_tests.txt" | tail -n 12
      step nan_reach.txt timeout 150 python3 -m bench.nan_reach
      grep -v -i warn "$out/nan_reach.txt" | tail -n 30
      # the GPU mutation check: the clamp taken out of the NaN-keeping split, its three tests must fail
      mutant numba_flash/tensorcore/ptx.py 's/clamp = "min.s32 r, r, 2147479551; " if keep_nan else ""/clamp = ""/' \
        nan_split_mutant.txt 200 python3 -m pytest -q -p no:cacheprovider -rfE --tb=no -n 8 -k \
        "keeping_split or nan_in_one_query_row_makes_that_row_of_dq or nans_in_q_and_do" tests/kernels/test_mma.py \
        tests/test_edge_values.py tests/kernels/test_tf32_backward_split_qdo.py
      grep -E "FAILED|passed|failed" "$out/nan_split_mutant.txt" | tail -n 8 ;;
    rescale_fma)
      step rescale_fma_tests.txt timeout 300 python3 -m pytest -v -p no:cacheprovider -rfE --tb=short -n 8 \
        tests/kernels/test_tc_rescale_fma.py tests/kernels/test_tc_stage_o_step.py
      grep -E "FAILED|passed|failed" "$out/rescale_fma_tests.txt" | tail -n 12
      fa2_rounds rescale_fma 200 --seqlens 512 1024 4096 --headdims 128 --causal both \
        --variants tc-fma0 tc-fma1 --repeats 15 --calls 10 --interleave ;;
    rescale_fma_long)
      step rescale_fma_long.log timeout 300 python3 -m bench.fa2_sweep --seqlens 2048 8192 16384 --headdims 128 --causal yes \
        --variants tc-fma0 tc-fma1 --repeats 8 --calls 3 --interleave --no-baselines --no-check --out "$out/rescale_fma_long.json"
      grep "^forward" "$out/rescale_fma_long.log" ;;
    ncu_sdpa_short)
      if ncu_found; then
        for who in sdpa ours; do
          if [ "$who" = sdpa ]; then alg='"algorithm":"sdpa_mem_efficient"'; else alg='"algorithm":"flash2","variant":"tensorcore"'; fi
          ncu_full "ncu_${who}_causal_fwd_d128_n512" "{$alg,\"pass\":\"forward\",\"batch\":32,\"nheads\":16,\"N\":512,\"d\":128,\"causal\":true}" 240
          grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per Thread|Block Size|Grid Size|Shared Memory Configuration Size|Dynamic Shared Memory Per Block|Static Shared Memory Per Block|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Executed Ipc Active|Block Limit" \
            "$out/ncu_${who}_causal_fwd_d128_n512.txt" | head -n 40
        done
      fi ;;
    timeline_f32)
      step timeline_f32.txt timeout 300 python3 -m bench.host_layers --timeline --dtype float32
      step host_profile_f32_d128.txt timeout 200 python3 -m bench.host_layers --profile --dtype float32 --headdim 128
      grep "^##\|profiled call" "$out/timeline_f32.txt" ;;
    ncu_src)
      if ncu_found; then
        stem=ncu_src_causal_fwd_d128_n512
        spec='{"algorithm":"flash2","variant":"tensorcore","pass":"forward","batch":32,"nheads":16,"N":512,"d":128,"causal":true}'
        step "$stem.txt" timeout 300 "$ncu_bin" --section SourceCounters --section WarpStateStats --section SchedulerStats \
          --section LaunchStats --nvtx --nvtx-include "numba_flash_measure/" --print-units base -o "/tmp/$stem" -f \
          python3 -m bench.ncu --child "$spec" --meta-out "$out/${stem}_meta.json"
        "$ncu_bin" --import "/tmp/$stem.ncu-rep" --page source --csv --print-source sass > "$out/$stem.csv" 2>> "$out/$stem.txt" \
          || { echo "run_pending: the source page export failed (see $stem.txt)" >&2; rc=1; }
        "$ncu_bin" --import "/tmp/$stem.ncu-rep" --print-units base >> "$out/$stem.txt" 2>&1
        wc -l "$out/$stem.csv"; grep -E "Duration|Registers Per Thread|Issue Slots Busy|No Eligible" "$out/$stem.txt" | head -n 8
      fi ;;
    nan_reach)
      step nan_reach.txt timeout 300 python3 -m bench.nan_reach
      cat "$out/nan_reach.txt" ;;
    half_bwd_cp)
      step half_bwd_cp.log python3 -m bench.half_sweep --backward --seqlens 1024 4096 --out "$out/half_bwd_cp.json"
      tail -n 40 "$out/half_bwd_cp.log" ;;
    *)
      echo "run_pending: unknown step '$s' (the steps: $(grep -oE '^    [a-z0-9_]+\)' "${BASH_SOURCE[0]}" | tr -d ' )' | tr '\n' ' '))" >&2
      rc=2 ;;
  esac
done
exit "$rc"
