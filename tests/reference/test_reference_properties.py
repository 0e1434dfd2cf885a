"""Property tests: for any shape and any block sizes, FA1 Algorithm 2 and FA2 Algorithm 1 compute
standard attention (Algorithm 0), with the same causal mask and dropout, and their counted HBM
accesses equal the IO model's closed forms.

Hypothesis draws the shapes (ragged, s_q != s_k, GQA groups, head dims from 1), the tiles (1 up to
larger than the sequence) and the options; the inputs come from a NumPy generator seeded by the drawn
``seed`` (fresh per example, reproducible from Hypothesis' report). Tolerance as in
test_forward_references.py: 1e-12 relative in float64.
"""

from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg2_forward import flash_forward_alg2
from numba_flash_reference.fa2_forward import flash_forward_fa2
from numba_flash_reference.io_model import count_io, io_alg2_forward, io_fa2_forward

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

RTOL = 1e-12


@st.composite
def problems(draw):
    h_k = draw(st.integers(1, 2))
    return dict(
        b=draw(st.integers(1, 2)),
        s_q=draw(st.integers(1, 20)),
        s_k=draw(st.integers(1, 20)),
        h=h_k * draw(st.integers(1, 3)),
        h_k=h_k,
        d=draw(st.integers(1, 9)),
        Br=draw(st.one_of(st.none(), st.integers(1, 24))),
        Bc=draw(st.one_of(st.none(), st.integers(1, 24))),
        causal=draw(st.booleans()),
        dropout_p=draw(st.sampled_from([0.0, 0.3])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def inputs(pb):
    rng = np.random.default_rng(pb["seed"])
    q = rng.standard_normal((pb["b"], pb["s_q"], pb["h"], pb["d"]))
    k = rng.standard_normal((pb["b"], pb["s_k"], pb["h_k"], pb["d"]))
    v = rng.standard_normal((pb["b"], pb["s_k"], pb["h_k"], pb["d"]))
    return q, k, v


def assert_close(a, b, what):
    assert not np.isnan(a).any(), f"{what}: NaN"
    np.testing.assert_array_equal(np.isinf(a), np.isinf(b), err_msg=what)
    fin = np.isfinite(b)
    scale = max(1.0, float(np.max(np.abs(b[fin]))) if fin.any() else 1.0)
    np.testing.assert_allclose(a[fin], b[fin], rtol=0, atol=RTOL * scale, err_msg=what)


@settings(max_examples=40, deadline=None)
@given(problems())
def test_alg2_equals_standard_attention_for_any_shape_and_tiles(pb):
    q, k, v = inputs(pb)
    opts = dict(causal=pb["causal"], dropout_p=pb["dropout_p"], seed=pb["seed"])
    ref = standard_attention(q, k, v, **opts)
    out, counted = count_io(flash_forward_alg2, q, k, v, Br=pb["Br"], Bc=pb["Bc"], **opts)
    for name in ("O", "L", "m", "l"):
        assert_close(getattr(out, name), getattr(ref, name), f"alg2 {name}")
    assert counted == io_alg2_forward(pb["s_q"], pb["d"], Br=pb["Br"], Bc=pb["Bc"], N_k=pb["s_k"], b=pb["b"], h=pb["h"])


@settings(max_examples=40, deadline=None)
@given(problems())
def test_fa2_forward_equals_standard_attention_for_any_shape_and_tiles(pb):
    q, k, v = inputs(pb)
    opts = dict(causal=pb["causal"], dropout_p=pb["dropout_p"], seed=pb["seed"])
    ref = standard_attention(q, k, v, **opts)
    out, counted = count_io(flash_forward_fa2, q, k, v, Br=pb["Br"], Bc=pb["Bc"], **opts)
    assert_close(out.O, ref.O, "fa2 O")
    assert_close(out.L, ref.L, "fa2 L")
    expected = io_fa2_forward(
        pb["s_q"], pb["d"], Br=pb["Br"], Bc=pb["Bc"], N_k=pb["s_k"], b=pb["b"], h=pb["h"], causal=pb["causal"]
    )
    assert counted == expected
