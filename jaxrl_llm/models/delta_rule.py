"""The gated delta rule: the recurrence of Gated DeltaNet linear attention, token by token and
chunked.

Per head, a matrix state ``S ∈ ℝ^{K×V}`` (key dim × value dim) is decayed, corrected towards
the new value along the new key, and read by the query (Yang, Kautz & Hatamizadeh 2024,
"Gated Delta Networks: Improving Mamba2 with Delta Rule", https://arxiv.org/abs/2412.06464,
eq. 10, written here with S transposed)::

    S_t = α_t S_{t−1} + β_t k_t (v_t − α_t S_{t−1}ᵀ k_t)ᵀ,      o_t = S_tᵀ q_t

with ``α_t = exp(g_t) ∈ (0, 1]`` the gate (g ≤ 0, in log space) and ``β_t ∈ [0, 1]`` the
writing strength. A token with ``g = 0`` and ``β = 0`` leaves the state unchanged, which is
how padding is expressed to both functions here.

:func:`delta_rule_recurrent` runs the recurrence one token at a time (``lax.scan``; the decode
step, and the reference). :func:`delta_rule_chunked` computes the same outputs and final state
in chunks of C tokens (Yang, Wang, Zhang, Shen & Kim 2024, "Parallelizing Linear Transformers
with the Delta Rule over Sequence Length", https://arxiv.org/abs/2406.06484 §3, with the gate
of the Gated DeltaNet paper §3.3): inside a chunk that starts from state S₀, with
``Γ_i = Σ_{j≤i} g_j`` (the chunk's cumulative log-decay up to token i), the written corrections
``δ_i = β_i (v_i − α_i S_{i−1}ᵀ k_i)`` solve the unit lower-triangular system (the UT
transform of the WY representation)::

    (I + A) Δ = diag(β) V − diag(β e^Γ) K S₀,      A_ij = β_i e^{Γ_i − Γ_j} k_iᵀ k_j  (j < i)

so that ``Δ = U − W S₀`` with ``U = (I + A)⁻¹ diag(β) V`` and ``W = (I + A)⁻¹ diag(β e^Γ) K``
computed for every chunk at once; then, chunk after chunk (a ``lax.scan`` over T / C steps)::

    O = diag(e^Γ) Q S₀ + (Q Kᵀ ⊙ M) Δ,     M_ij = e^{Γ_i − Γ_j} [j ≤ i]
    S_C = e^{Γ_C} S₀ + Kᵀ diag(e^{Γ_C − Γ}) Δ

Memory is O(T·C) for the intra-chunk matrices and O(T / C) states, instead of the T states a
token-by-token scan keeps for its backward pass. Every exponent above is ≤ 0 where it is used.

Shapes: B rows, T tokens, H heads (value heads; query/key heads already repeated to them),
K key head dim, V value head dim, C chunk length.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def _check(q, k, v, g, beta, state):
    chex.assert_rank([q, k, v], 4)
    chex.assert_equal_shape([q, k])
    chex.assert_equal_shape_prefix([q, v], 3)
    chex.assert_shape([g, beta], q.shape[:3])
    b, _, h, dk = q.shape
    if state is not None:
        chex.assert_shape(state, (b, h, dk, v.shape[-1]))


def _start_state(q, k, v, g, beta, initial_state) -> jax.Array:
    """The inputs checked; the float32 state ``[B, H, K, V]`` before the first token."""
    _check(q, k, v, g, beta, initial_state)
    b, _, h, dk = q.shape
    if initial_state is None:
        return jnp.zeros((b, h, dk, v.shape[-1]), jnp.float32)
    return initial_state.astype(jnp.float32)


def delta_rule_recurrent(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule one token at a time (the recurrence in the module docstring).

    Computed in float32 whatever the inputs' dtype.

    Args:
      q, k: ``[B, T, H, K]`` queries (already scaled) and keys (already L2-normalised).
      v: ``[B, T, H, V]`` values.
      g: ``[B, T, H]`` log-decay (≤ 0); beta: ``[B, T, H]`` writing strength in [0, 1].
      initial_state: ``[B, H, K, V]`` state before the first token; None = zeros.

    Returns:
      (outputs ``[B, T, H, V]`` float32, the state after the last token ``[B, H, K, V]`` float32).
    """
    s0 = _start_state(q, k, v, g, beta, initial_state)
    f32 = jnp.float32

    def step(s, xs):
        q_t, k_t, v_t, g_t, b_t = xs  # [B, H, K], [B, H, K], [B, H, V], [B, H], [B, H]
        s = s * jnp.exp(g_t)[..., None, None]
        pred = jnp.einsum("bhkv,bhk->bhv", s, k_t)
        s = s + jnp.einsum("bhk,bhv->bhkv", k_t, b_t[..., None] * (v_t - pred))
        return s, jnp.einsum("bhkv,bhk->bhv", s, q_t)

    xs = tuple(jnp.moveaxis(x.astype(f32), 1, 0) for x in (q, k, v, g, beta))
    s, o = jax.lax.scan(step, s0, xs)
    return jnp.moveaxis(o, 0, 1), s


def delta_rule_chunked(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    *,
    chunk_size: int = 64,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule in chunks of ``chunk_size`` tokens (the WY / UT-transform form in
    the module docstring); equal to :func:`delta_rule_recurrent` up to float rounding, values
    and gradients. T need not be a multiple of the chunk: the tail is filled with tokens that
    leave the state unchanged (g = 0, β = 0) and their outputs dropped.

    Args and Returns: as :func:`delta_rule_recurrent`; ``chunk_size`` C ≥ 1 (static).
    """
    s0 = _start_state(q, k, v, g, beta, initial_state)
    b, t, h, _ = q.shape
    dv = v.shape[-1]
    c = int(chunk_size)
    if c < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    f32 = jnp.float32
    n = -(-t // c)
    pad = n * c - t

    def chunks(x):  # [B, T, H, ...] -> [B, H, N, C, ...] float32, the tail padded with zeros
        x = jnp.pad(x.astype(f32), [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(b, n, c, h, *x.shape[3:])
        return jnp.moveaxis(x, 3, 1)

    q_c, k_c, v_c, g_c, b_c = (chunks(x) for x in (q, k, v, g, beta))
    gam = jnp.cumsum(g_c, axis=-1)  # Γ [B, H, N, C]
    diff = gam[..., :, None] - gam[..., None, :]  # Γ_i − Γ_j
    lower = jnp.tril(jnp.ones((c, c), bool))
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    # Double where: the masked entries (j > i, positive exponents) never reach exp.
    decay = jnp.where(lower, jnp.exp(jnp.where(lower, diff, 0.0)), 0.0)  # M [.., C, C]
    kk = jnp.einsum("bhnik,bhnjk->bhnij", k_c, k_c)
    a = jnp.where(strict, b_c[..., :, None] * decay * kk, 0.0)
    eye = jnp.eye(c, dtype=f32)
    rhs = jnp.concatenate(
        [b_c[..., None] * v_c, (b_c * jnp.exp(gam))[..., None] * k_c], axis=-1
    )  # [B, H, N, C, V + K]
    sol = jax.lax.linalg.triangular_solve(
        eye + a, rhs, left_side=True, lower=True, unit_diagonal=True
    )
    u, w = sol[..., :dv], sol[..., dv:]
    qk = jnp.einsum("bhnik,bhnjk->bhnij", q_c, k_c) * decay
    q_dec = jnp.exp(gam)[..., None] * q_c  # diag(e^Γ) Q
    k_dec = jnp.exp(gam[..., -1:] - gam)[..., None] * k_c  # diag(e^{Γ_C − Γ}) K
    last = jnp.exp(gam[..., -1])  # e^{Γ_C} [B, H, N]

    def step(s, xs):
        u_n, w_n, qk_n, qd_n, kd_n, last_n = xs
        delta = u_n - jnp.einsum("bhck,bhkv->bhcv", w_n, s)
        o = jnp.einsum("bhck,bhkv->bhcv", qd_n, s) + jnp.einsum("bhij,bhjv->bhiv", qk_n, delta)
        s = last_n[..., None, None] * s + jnp.einsum("bhck,bhcv->bhkv", kd_n, delta)
        return s, o

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (u, w, qk, q_dec, k_dec, last))
    s, o = jax.lax.scan(step, s0, xs)  # o [N, B, H, C, V]
    o = jnp.moveaxis(o, 0, 2).reshape(b, h, n * c, dv)[:, :, :t]
    return jnp.moveaxis(o, 1, 2), s


def gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    *,
    chunk_size: int = 64,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule over T new tokens: :func:`delta_rule_recurrent` for one token (the
    decode step), :func:`delta_rule_chunked` otherwise. Args and Returns as those."""
    if q.shape[1] == 1:
        return delta_rule_recurrent(q, k, v, g, beta, initial_state)
    return delta_rule_chunked(q, k, v, g, beta, initial_state, chunk_size=chunk_size)
