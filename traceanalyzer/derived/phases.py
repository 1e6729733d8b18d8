"""What each iteration served: its phase, the evidence for it, and its new tokens.

``phase`` is ``prefill``, ``decode``, ``mixed`` (chunked prefill with decodes in one batch),
``spec_decode``, ``dummy`` (a data-parallel padding batch), ``warmup``, ``idle`` or ``unknown``;
``phase_source`` says what told it:

- ``annotation``: the host said so: vLLM's step annotation with its request and token counts,
  the model runner's scopes, the Python tracer's ``_dummy_run`` / ``sample_tokens`` /
  ``kv_connector_no_forward``, a graph capture or start-up function;
- ``shapes``: the attention kernels' input shapes (kernel_details.csv ``Input Shapes``, Level1):
  the query's first dim is the batch's tokens T (TND layout, sliced to the real count outside a
  captured graph), the block table's the requests B; T = B is decode, one request of T > 1
  tokens is prefill, a key shaped like the query is prefill without cache;
- ``kernels``: the kernel signatures: vllm-ascend v0.11's ATB paged attention (decode) and flash
  attention (prefill), splitfuse (mixed), a FULL graph replay (uniform decode batches only);
- ``none``: nothing tells, and ``phase_reason`` says what is missing.

Padding cannot fool the count: tokens come only from the attention query of a kernel that ran
eagerly (a graph replays the shapes of its capture size: its tokens are unknown), never from
the matmuls (padded to the graph size and the data-parallel maximum). Ambiguous evidence is
``unknown`` with the reason: a confident wrong label is worse than none.
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.derived.windows import annotation_match, window_index
from traceanalyzer.engine.params import Params

PHASES = ("prefill", "decode", "mixed", "spec_decode", "dummy", "warmup", "idle", "unknown")
UNKNOWN_PHASE = "unknown"  # nothing told the phase (phase_reason says why)
IDLE_PHASE = "idle"  # the time between two iterations: the scheduler had nothing to run
PHASE_SOURCES = ("annotation", "shapes", "kernels", "none")
# what a rule that judges the steady state of serving looks at
STEADY_PHASES = ("prefill", "decode", "mixed", "spec_decode", "unknown")


def _counts(
    points: pl.DataFrame, windows: pl.DataFrame, kinds: dict[str, pl.Expr], at: str = "start_ns"
) -> pl.DataFrame:
    """Per window (``_w``): how many of the ``points`` (session, ``at``) that lie in it are of
    each kind (a column each); the points are placed once for every kind."""
    flagged = points.select(
        "session", at, *(where.fill_null(False).alias(c) for c, where in kinds.items())
    )
    placed = window_index(flagged, windows, at=at)
    return placed.group_by("_w").agg(pl.col(c).sum() for c in kinds)


def marker_counts(
    windows: pl.DataFrame, host: pl.DataFrame, cann: pl.DataFrame, p: Params
) -> pl.DataFrame:
    """Per window (``_w``): how many of each host marker start inside it, and the counts its
    vLLM annotation states."""
    name, python = pl.col("name"), pl.col("cat") == "python_function"
    markers = {
        "n_sample": (python & name.str.contains(p.sample_function))
        | name.is_in(list(p.scope_sample)),
        "n_draft": (python & name.str.contains(p.draft_function)) | name.is_in(list(p.scope_draft)),
        "n_dummy": python & name.str.contains(p.dummy_function),
        "n_execute": python & name.str.contains(p.execute_function),
        "n_no_forward": name.str.contains(p.no_forward_function),
        "n_warmup_fn": python & name.str.contains(p.warmup_function),
    }
    api = pl.col("api_name")
    calls = {
        "n_capture": api.str.contains(p.capture_begin),
        "n_replay": api.is_in(list(p.replay_apis)),
    }
    counts = (
        windows.select("_w")
        .join(_counts(host, windows, markers), on="_w", how="left")
        .join(_counts(cann, windows, calls), on="_w", how="left")
        .with_columns(pl.exclude("_w").fill_null(0))
    )
    notes = host.filter(annotation_match(p)).select("session", "start_ns", "name")
    owned = window_index(notes, windows).unique("_w", keep="first")
    full, detailed, legacy = (
        p.annotation_pattern,
        p.detailed_annotation_pattern,
        p.legacy_annotation_pattern,
    )
    n = pl.col("name")
    said = owned.select(
        "_w",
        pl.coalesce(n.str.extract(full, 1), n.str.extract(detailed, 1))
        .cast(pl.Int64)
        .alias("ctx_reqs"),
        n.str.extract(full, 2).cast(pl.Int64).alias("ctx_tokens"),
        pl.coalesce(n.str.extract(full, 3), n.str.extract(detailed, 2))
        .cast(pl.Int64)
        .alias("gen_reqs"),
        n.str.extract(full, 4).cast(pl.Int64).alias("gen_tokens"),
        n.str.extract(legacy, 1).cast(pl.Int64).alias("new_reqs"),
        n.str.extract(legacy, 2).cast(pl.Int64).alias("cached_reqs"),
    )
    return counts.join(said, on="_w", how="left")


def _dims(shape: pl.Expr, index: int) -> pl.Expr:
    """The ``index``-th input's shape of a `;`-separated Input Shapes list, as its dims."""
    return (
        shape.str.split(";").list.get(index, null_on_oob=True).str.strip_chars('" ').str.split(",")
    )


def attention_evidence(kernels: pl.DataFrame, windows: pl.DataFrame, p: Params) -> pl.DataFrame:
    """Per window (``_w``), from its attention kernels (``kernels``: the kernels table's rows
    with ``launch_ns``, the host time that launched each, else its device start): the tokens T
    and requests B of the eager ones' shapes (the most common values), whether one ran without
    a cache, how many ran in a captured graph, how many started after the step's sampler (a
    drafter's forward, which runs in ``sample_tokens``; ``kernels`` holds the sampler kernels
    too), the replays' token dim and the sampler's rows (:func:`_batch_sizes`), and the decode /
    prefill / mixed signatures."""
    attention = kernels.filter(pl.col("type").is_in(list(p.attention_types)))
    query, key = _dims(pl.col("input_shapes"), 0), _dims(pl.col("input_shapes"), 1)
    types = pl.col("input_data_types").str.split(";")
    shapes = pl.col("input_shapes").str.split(";")
    batch = pl.struct(shapes.alias("s"), types.alias("t")).map_elements(
        _batch_inputs,
        return_dtype=pl.Struct({"table_rows": pl.Int64, "seq_lengths": pl.Int64}),
    )
    eager = pl.col("model_id").is_null()
    # once per distinct inputs (a model's attention kernels share a few), not once per kernel
    inputs = ["input_shapes", "input_data_types"]
    tables = (
        attention.select(inputs)
        .unique()
        .with_columns(batch.alias("_batch"))
        .unnest("_batch")
        .with_columns(
            pl.col("table_rows").is_not_null().alias("block_table"),
            pl.coalesce("table_rows", "seq_lengths").alias("B"),
        )
        .drop("table_rows", "seq_lengths")
    )
    # Without a cache the key is the current K, ``T,Nkv,D``: its first dim is the query's T
    # whatever the head counts (GQA/MQA have fewer key heads), and no block table is passed
    # (PrefillNoCache); every other state reads a paged cache view through a block table.
    key_tokens = key.list.first().cast(pl.Int64, strict=False)
    query_tokens = query.list.first().cast(pl.Int64, strict=False)
    attention = attention.join(
        tables, on=inputs, how="left", nulls_equal=True, maintain_order="left"
    ).with_columns(
        query_tokens.alias("T"),
        ((key_tokens == query_tokens) & ~pl.col("block_table").fill_null(False))
        .fill_null(False)
        .alias("no_cache"),
        key.list.join(",").alias("key_shape"),
        eager.alias("eager"),
    )
    owned = window_index(attention.rename({"launch_ns": "_at"}), windows, at="_at")
    # The drafter runs in sample_tokens, after the step's sampler: attention kernels that start
    # on the device after the window's first sampler kernel that follows the window's own
    # attention (a sampler placed here by its device start may be the step before's).
    first_attention = owned.group_by("_w").agg(pl.col("start_ns").min().alias("_first"))
    sampled_at = (
        window_index(
            kernels.filter(pl.col("name").str.contains(p.sampler_kernels)).rename(
                {"launch_ns": "_at"}
            ),
            windows,
            at="_at",
        )
        .join(first_attention, on="_w")
        .filter(pl.col("start_ns") > pl.col("_first"))
        .group_by("_w")
        .agg(pl.col("start_ns").min().alias("_sampled"))
    )
    owned = owned.join(sampled_at, on="_w", how="left")
    after_sampling = pl.col("_sampled").is_not_null() & (pl.col("start_ns") > pl.col("_sampled"))
    drafter = (
        owned.filter(after_sampling)
        .group_by("_w")
        .agg(pl.len().alias("n_attn_drafter"), pl.col("start_ns").min().alias("_drafted"))
    )
    # the step's own attention: the drafter's, after the sampler, has shapes of its own
    owned = owned.filter(~after_sampling)
    eager_rows = owned.filter(pl.col("eager"))
    shape_stats = eager_rows.group_by("_w").agg(
        pl.col("T").drop_nulls().mode().max().alias("T"),
        pl.col("B").drop_nulls().mode().max().alias("B"),
        pl.col("no_cache").any().alias("no_cache"),
        pl.col("block_table").fill_null(False).any().alias("block_table"),
        pl.col("key_shape").drop_nulls().mode().sort().first().alias("key_shape"),
        pl.len().alias("n_attn_eager"),
    )
    # a graph's shapes are its capture size's: padded, but tokens per request stay uniform
    graph = (
        owned.filter(~pl.col("eager"))
        .group_by("_w")
        .agg(
            pl.len().alias("n_attn_graph"),
            (pl.col("T") / pl.col("B")).drop_nulls().mode().max().alias("graph_ratio"),
        )
    )
    sizes = _batch_sizes(kernels, windows, p, drafter.select("_w", "_drafted"))
    name = pl.col("name")
    signatures = _counts(
        kernels.rename({"launch_ns": "_at"}),
        windows,
        {
            "n_decode_kernels": name.str.contains(p.decode_kernels),
            "n_prefill_kernels": name.str.contains(p.prefill_kernels),
            "n_mixed_kernels": name.str.contains(p.mixed_kernels),
        },
        at="_at",
    )
    return (
        windows.select("_w")
        .join(signatures, on="_w", how="left")
        .join(shape_stats, on="_w", how="left")
        .join(graph, on="_w", how="left")
        .join(drafter, on="_w", how="left")
        .join(sizes, on="_w", how="left")
        .with_columns(
            pl.col("n_decode_kernels", "n_prefill_kernels", "n_mixed_kernels", "n_attn_eager",
                   "n_attn_graph", "n_attn_drafter").fill_null(0),
            pl.col("no_cache").fill_null(False),
        )
    )  # fmt: skip


def first_dim(shapes: pl.Expr) -> pl.Expr:
    """The first dim of a kernel's first input (Input Shapes), as a number."""
    return _dims(shapes, 0).list.first().cast(pl.Int64, strict=False)


def _batch_sizes(
    kernels: pl.DataFrame, windows: pl.DataFrame, p: Params, drafted: pl.DataFrame
) -> pl.DataFrame:
    """Per window (``_w``): ``replayed_tokens``, the token dim of the kernels a graph replayed
    (the most common: the capture size), and ``sampled_rows``, the requests the sampler's
    argmax ran on before the drafter started (``drafted``: ``_drafted``, its first attention;
    the fewest rows: a verifying step's target argmax runs on the draft tokens, its bonus
    argmax on the requests)."""
    replayed = kernels.filter(
        pl.col("model_id").is_not_null() & pl.col("type").is_in(list(p.token_kernels))
    ).rename({"launch_ns": "_at"})
    graph_size = (
        window_index(replayed, windows, at="_at")
        .with_columns(first_dim(pl.col("input_shapes")).alias("_size"))
        .group_by("_w")
        .agg(pl.col("_size").drop_nulls().mode().max().alias("replayed_tokens"))
    )
    argmax = kernels.filter(pl.col("name").str.contains(p.batch_kernels)).rename(
        {"launch_ns": "_at"}
    )
    rows = (
        window_index(argmax, windows, at="_at")
        .join(drafted, on="_w", how="left")
        .filter(pl.col("_drafted").is_null() | (pl.col("start_ns") < pl.col("_drafted")))
        .with_columns(first_dim(pl.col("input_shapes")).alias("_rows"))
        .group_by("_w")
        .agg(pl.col("_rows").drop_nulls().min().alias("sampled_rows"))
    )
    return (
        windows.select("_w").join(graph_size, on="_w", how="left").join(rows, on="_w", how="left")
    )


def _batch_inputs(row: dict) -> dict[str, int | None]:
    """The requests an attention kernel's inputs tell: ``table_rows``, the rows of its block
    table (the first two-dim INT32 input: ``B,max_blocks``); ``seq_lengths``, the dim of its
    first one-dim INT64 input (FIA's ``actual_seq_lengths``, ``[B]``, passed in every state).
    An absent optional input is an empty field of Input Shapes, its type DT_UNDEFINED."""
    rows = lengths = None
    for shape, dtype in zip(row["s"] or [], row["t"] or [], strict=False):
        dims = [d.strip() for d in shape.strip('" ').split(",")]
        if not dims[0].isdigit():
            continue
        kind = dtype.strip().upper()
        if rows is None and len(dims) == 2 and kind.endswith("INT32"):
            rows = int(dims[0])
        elif lengths is None and len(dims) == 1 and kind.endswith("INT64"):
            lengths = int(dims[0])
    return {"table_rows": rows, "seq_lengths": lengths}


def classify(frame: pl.DataFrame, p: Params) -> pl.DataFrame:
    """Add ``phase``, ``phase_source``, ``phase_reason``, ``tokens``, ``requests`` and ``graph``
    to the windows with their evidence (:func:`marker_counts`, :func:`attention_evidence`,
    ``n_compute``), in order of trust; every row gets one."""
    c = pl.col
    gap = c("step_source") == "gap"
    warm = (
        (c("n_capture") > 0)
        | (c("n_warmup_fn") > 0)
        | ((c("step_source") == "profiler_step") & (c("step") <= p.warmup_steps))
    )
    dummy = (c("n_dummy") > 0) & (c("n_sample") == 0) & (c("n_execute") <= c("n_dummy"))
    runs = c("step_source").is_in(["annotation", "scope", "python_function"])
    no_forward = (c("n_no_forward") > 0) | (runs & (c("n_compute") == 0))
    # a drafter: its markers, or attention kernels after the step's sampler (sample_tokens)
    drafted = (c("n_draft") > 0) | (c("n_attn_drafter") > 0)
    ctx, gen = c("ctx_reqs"), c("gen_reqs")
    said = ctx.is_not_null() & gen.is_not_null()
    new, cached = c("new_reqs"), c("cached_reqs")
    T, B = c("T"), c("B")
    shaped = T.is_not_null()
    graph_only = (c("n_replay") > 0) & (c("n_attn_eager") == 0) & (c("n_attn_graph") > 0)
    # every request 1 + k tokens (k of 1..7 drafts): a prompt chunk beside decodes or a few
    # equal prompts give such a ratio only by chance
    ratio = T / B
    per_request = (B >= 1) & (T % B == 0) & (ratio >= 2) & (ratio <= 8)
    uniform_drafts = (B > 1) & per_request
    # The session's 1 + k (num_speculative_tokens is fixed per server): the tokens per request
    # of its drafted batches of several requests, so that a drafted batch of one request is
    # judged by the same k (a one-request prefill of T tokens is drafted after too).
    session_ratio = (
        ratio.filter(drafted & uniform_drafts & ~c("no_cache")).mode().min().over("session")
    )
    # the rejection sampler runs only when the batch holds draft tokens to verify: where a
    # session shows it, a step without it verified nothing
    verified = (c("n_verify") > 0) & per_request & ~c("no_cache")
    session_verifies = (c("n_verify") > 0).any().over("session")
    drafted_uniform = (
        drafted
        & per_request
        & ~c("no_cache")
        & ~session_verifies
        & (session_ratio.is_null() | (ratio == session_ratio))
    )

    def decode_or_spec() -> pl.Expr:
        return pl.when(drafted).then(pl.lit("spec_decode")).otherwise(pl.lit("decode"))

    rules: list[tuple[pl.Expr, pl.Expr, str, pl.Expr]] = [
        # (when, phase, source, reason)
        (gap & (c("n_compute") > 0), pl.lit("unknown"), "none", pl.lit("device work between iterations with no host marker of its own (a data-parallel dummy batch, or an iteration the markers missed)")),
        (gap, pl.lit("idle"), "none", pl.format("no iteration ran for {} ms", ((c("end_ns") - c("start_ns")) / 1e6).round(2))),
        (warm, pl.lit("warmup"), "annotation", pl.when(c("n_capture") > 0).then(pl.lit("graph capture")).when(c("n_warmup_fn") > 0).then(pl.lit("engine start-up")).otherwise(pl.lit(f"ProfilerStep numbered <= warmup_steps ({p.warmup_steps})"))),
        (dummy, pl.lit("dummy"), "annotation", pl.lit("a data-parallel dummy batch (_dummy_run, no sampling)")),
        (no_forward, pl.lit("idle"), "annotation", pl.when(c("n_no_forward") > 0).then(pl.lit("no forward: requests wait for their KV cache (kv_connector_no_forward)")).otherwise(pl.lit("execute_model ran no forward (no kernels)"))),
        (said & (ctx > 0) & (gen == 0), pl.lit("prefill"), "annotation", pl.lit("step annotation: context requests only")),
        (said & (ctx == 0) & (gen > 0) & (c("gen_tokens") > gen), pl.lit("spec_decode"), "annotation", pl.format("step annotation: {} generation tokens for {} requests (draft tokens verified)", c("gen_tokens"), gen)),
        (said & (ctx == 0) & (gen > 0), decode_or_spec(), "annotation", pl.lit("step annotation: generation requests only")),
        (said & (ctx > 0) & (gen > 0), pl.lit("mixed"), "annotation", pl.lit("step annotation: context and generation requests")),
        (new.is_not_null() & (new > 0) & (cached == 0), pl.lit("prefill"), "annotation", pl.lit("step annotation: new requests only")),
        (new.is_not_null() & (new > 0) & (cached > 0), pl.lit("mixed"), "annotation", pl.lit("step annotation: new and cached requests")),
        # the main model replays a graph of 1 + k tokens per request; an eager drafter beside it
        ((c("graph_ratio") >= 2) & (c("n_attn_graph") >= c("n_attn_eager")), pl.lit("spec_decode"), "kernels", pl.format("a graph replay of {} tokens per request: 1 + draft tokens verified", c("graph_ratio"))),
        (shaped & c("no_cache"), pl.lit("prefill"), "shapes", pl.format("attention key {} of the query's {} tokens and no block table: prefill without cache", c("key_shape"), T)),
        # the drafter's evidence decides before any token count, for one request too
        (shaped & verified, pl.lit("spec_decode"), "shapes", pl.format("draft tokens verified (rejection sampler) in {} tokens over {} requests, {} each", T, B, T // B)),
        (shaped & drafted_uniform, pl.lit("spec_decode"), "shapes", pl.format("a drafter beside {} tokens over {} requests, {} each: 1 + draft tokens verified", T, B, T // B)),
        (shaped & B.is_not_null() & (T == B), decode_or_spec(), "shapes", pl.format("attention query of {} tokens for {} requests: one token each", T, B)),
        (shaped & (B == 1) & (T > 1), pl.lit("prefill"), "shapes", pl.format("attention query of {} tokens for one request", T)),
        (shaped & uniform_drafts, pl.lit("spec_decode"), "shapes", pl.format("{} tokens over {} requests, {} each: 1 + draft tokens verified", T, B, T // B)),
        (c("n_mixed_kernels") > 0, pl.lit("mixed"), "kernels", pl.lit("splitfuse attention kernels")),
        ((c("n_prefill_kernels") > 0) & (c("n_decode_kernels") > 0), pl.lit("mixed"), "kernels", pl.lit("prefill and decode attention kernels in one step")),
        (c("n_prefill_kernels") > 0, pl.lit("prefill"), "kernels", pl.lit("prefill attention kernels")),
        (c("n_decode_kernels") > 0, decode_or_spec(), "kernels", pl.lit("decode attention kernels")),
        (graph_only, decode_or_spec(), "kernels", pl.lit("a FULL graph replay: uniform decode batches only")),
    ]  # fmt: skip
    # the first rule that holds, by its index: each condition is evaluated once (three chains
    # of every condition, one per column, took most of the derivation's time on few steps)
    first = pl.when(rules[0][0].fill_null(False)).then(0)
    for index, (when, *_) in enumerate(rules[1:], start=1):
        first = first.when(when.fill_null(False)).then(index)
    frame = frame.with_columns(first.alias("_rule"))

    def pick(values: list[pl.Expr], otherwise: pl.Expr) -> pl.Expr:
        picked = pl.when(c("_rule") == 0).then(values[0])
        for index, value in enumerate(values[1:], start=1):
            picked = picked.when(c("_rule") == index).then(value)
        return picked.otherwise(otherwise)

    frame = frame.with_columns(
        pick([what for _, what, _, _ in rules], pl.lit("unknown")).alias("phase"),
        c("_rule")
        .replace_strict(
            list(range(len(rules))), [where for _, _, where, _ in rules], default="none"
        )
        .alias("phase_source"),
        pick([why for *_, why in rules], _unknown_reason(p)).alias("phase_reason"),
    ).drop("_rule")
    # Decodes run on from step to step (continuous batching): a batch of more tokens than
    # requests right after decoding holds those decodes and a prefill chunk.
    before = c("phase").shift(1).over("session", order_by="start_ns")
    running = before.is_in(["decode", "spec_decode", "mixed"]).fill_null(False)
    joined = (c("phase") == "unknown") & shaped & (B > 1) & (T > B) & running
    chunk = "{} tokens over {} requests while decodes run on from the step before: a prefill chunk beside them"
    frame = frame.with_columns(
        pl.when(joined).then(pl.lit("mixed")).otherwise(c("phase")).alias("phase"),
        pl.when(joined).then(pl.lit("shapes")).otherwise(c("phase_source")).alias("phase_source"),
        pl.when(joined)
        .then(pl.format(chunk, T, B))
        .otherwise(c("phase_reason"))
        .alias("phase_reason"),
    )
    # A batch that does not sample, among iterations that do, is a data-parallel dummy batch
    # (told by no host marker here: a marked one is an annotated dummy already).
    forward = c("phase").is_in(["prefill", "decode", "mixed", "spec_decode"])
    sampling_share = (c("n_sampler") > 0).filter(forward).mean().over("session").fill_null(0)
    unsampled = (
        c("phase").is_in(["decode", "spec_decode"])
        & c("phase_source").is_in(["shapes", "kernels"])
        & (c("n_sampler") == 0)
        & (c("n_execute") == 0)
        & (sampling_share >= 0.8)
    )
    frame = frame.with_columns(
        pl.when(unsampled).then(pl.lit("dummy")).otherwise(c("phase")).alias("phase"),
        pl.when(unsampled)
        .then(pl.lit("no sampling kernels, where the other iterations sample: a dummy batch"))
        .otherwise(c("phase_reason"))
        .alias("phase_reason"),
    )
    tokens = (
        pl.when(c("phase_source") == "annotation")
        .then(c("ctx_tokens") + c("gen_tokens"))
        .when(c("phase_source") == "shapes")
        .then(T)
    )
    requests = (
        pl.when(c("phase_source") == "annotation")
        .then(pl.coalesce(ctx + gen, new + cached))
        .when(c("phase_source") == "shapes")
        .then(B)
    )
    graph = (
        pl.when(c("n_replay") > 0)
        .then(pl.when(c("n_attn_eager") > 0).then(pl.lit("piecewise")).otherwise(pl.lit("full")))
        .when(c("n_compute") > 0)
        .then(pl.lit("eager"))
    )
    idle = c("phase").is_in(["idle", "warmup"])
    frame = frame.with_columns(
        pl.when(idle).then(None).otherwise(tokens).alias("tokens"),
        pl.when(idle).then(None).otherwise(requests).alias("requests"),
        graph.alias("graph"),
    )
    return _graph_sizes(frame)


def _graph_sizes(frame: pl.DataFrame) -> pl.DataFrame:
    """``graph_size`` (the capture size a replay ran at), ``batch`` (the real requests, from the
    strongest evidence: the annotation, the eager attention's shapes, the sampler's rows, which
    run outside the graph on the real batch; ``batch_source`` says which) and
    ``padded_tokens`` (the tokens the replay computed beyond the real ones: the capture size
    minus the batch's 1 + k tokens each in a FULL replay, minus the eager attention's tokens in
    a piecewise one; none in an eager step)."""
    c = pl.col
    served = c("phase").is_in(["prefill", "decode", "mixed", "spec_decode", "unknown"])
    replayed = c("graph").is_in(["full", "piecewise"])
    shaped_batch = pl.when(c("n_attn_eager") > 0).then(c("B"))
    batch_source = (
        pl.when(~served)
        .then(None)
        .when(c("requests").is_not_null() & (c("phase_source") == "annotation"))
        .then(pl.lit("annotation"))
        .when(c("requests").is_not_null() | shaped_batch.is_not_null())
        .then(pl.lit("attention"))
        .when(c("sampled_rows").is_not_null())
        .then(pl.lit("sampler"))
    )
    batch = (
        pl.when(c("batch_source") == "annotation")
        .then(c("requests"))
        .when(c("batch_source") == "attention")
        .then(pl.coalesce("requests", shaped_batch))
        .when(c("batch_source") == "sampler")
        .then(c("sampled_rows"))
    )
    per_request = c("graph_ratio").fill_null(1.0)
    padded = (
        pl.when(c("graph") == "full")
        .then(c("graph_size") - (c("batch") * per_request).round().cast(pl.Int64))
        .when(c("graph") == "piecewise")
        .then(c("graph_size") - c("T"))
        .when(c("graph") == "eager")
        .then(pl.lit(0, dtype=pl.Int64))
    )
    return (
        frame.with_columns(
            pl.when(replayed & served).then(c("replayed_tokens")).alias("graph_size"),
            batch_source.alias("batch_source"),
        )
        .with_columns(batch.alias("batch"))
        .with_columns(pl.when(served).then(padded.clip(0)).alias("padded_tokens"))
    )


def _unknown_reason(p: Params) -> pl.Expr:
    c = pl.col
    key = (
        pl.when(c("key_shape").is_not_null())
        .then(pl.format(", key {}", c("key_shape")))
        .otherwise(pl.lit(""))
    )
    return (
        pl.when(c("T").is_not_null() & c("B").is_not_null())
        .then(pl.format("T = {}, B = {} ({}){}: more tokens than requests, a prefill of several prompts with cached prefixes or a mixed batch; the kernel holds no per-request lengths to tell", c("T"), c("B"), pl.when(c("block_table")).then(pl.lit("block table")).otherwise(pl.lit("actual_seq_lengths, no block table")), key))
        .when(c("T").is_not_null())
        .then(pl.format("T = {}, no requests in the shapes (no block table, no actual_seq_lengths){}: the shapes cannot tell the phase", c("T"), key))
        .when(c("n_attn_eager") > 0)
        .then(pl.lit("eager attention kernels without input shapes (collect profiler_level=Level1 for kernel_details.csv shapes)"))
        .when(c("n_attn_graph") > 0)
        .then(pl.lit("attention only inside a graph replay, whose shapes are its capture size's, and no FULL replay to tell decode"))
        .otherwise(pl.lit("no serving evidence: no vLLM annotation, scopes, python functions or attention kernels"))
    )  # fmt: skip
