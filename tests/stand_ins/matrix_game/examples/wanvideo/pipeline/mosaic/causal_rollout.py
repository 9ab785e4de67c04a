"""Stand-in of ``examples/wanvideo/pipeline/mosaic/causal_rollout.py``: the few-step
causal KV rollout, one monolithic loop like upstream's ``_run_causal_kv_rollout``, calling
the same module-level names in the same order per chunk."""

from __future__ import annotations

import torch
from diffsynth.core.data.nonlocal_memory_context import (
    rolling_anchor_source_position as _rolling_anchor_source_position,
)
from diffsynth.inference.causal_schedule import prepare_causal_dmd_eval_scheduler
from diffsynth.pipelines.wan_video import (
    WAN_VIDEO_PROPE_CAMERA_UNIT,
    init_causal_kv_caches,
    model_fn_causal_kv,
)

from .causal_memory import (
    _build_initial_causal_kv_dynamic_context_pool,
    _decode_generated_chunk_from_prefix_latents,
)
from .video_io import _decode_latents_to_numpy_frames, _encode_frames_per_frame

_MODES = {"c0_plus_generated", "gt", "c0_only", "empty"}


def _normalize_causal_validation_memory_mode(value):
    """Mirrors ``_normalize_causal_validation_memory_mode``."""
    mode = str(value or "c0_plus_generated").strip().lower().replace("-", "_")
    mode = {"generated": "c0_plus_generated", "none": "empty", "c0": "c0_only"}.get(mode, mode)
    if mode not in _MODES:
        raise ValueError(
            "causal_validation_memory_mode must be 'c0_plus_generated', 'gt', "
            f"'c0_only', or 'empty', got {value!r}."
        )
    return mode


def _validation_memory_mode_uses_runtime_pool(value):
    """Mirrors ``_validation_memory_mode_uses_runtime_pool``."""
    return _normalize_causal_validation_memory_mode(value) != "empty"


def _validation_memory_mode_uses_online_depth(value):
    """Mirrors ``_validation_memory_mode_uses_online_depth``."""
    return _normalize_causal_validation_memory_mode(value) not in {"empty", "gt"}


def _causal_kv_concat_caches(left, right):
    """Mirrors ``_causal_kv_concat_caches``."""
    if not left:
        return [dict(c) for c in right]
    out = []
    for lc, rc in zip(left, right, strict=False):
        if lc["k"] is None:
            out.append(dict(rc))
            continue
        if rc["k"] is None:
            out.append(dict(lc))
            continue
        out.append(
            {
                "k": torch.cat([lc["k"], rc["k"]], 1),
                "v": torch.cat([lc["v"], rc["v"]], 1),
                "positions": lc["positions"] + rc["positions"],
                "frames": lc["frames"] + rc["frames"],
                "chunk_ids": lc["chunk_ids"] + rc["chunk_ids"],
            }
        )
    return out


def _causal_kv_slice(cache_list, keep):
    out = []
    for c in cache_list:
        per = c["k"].shape[1] // len(c["frames"])
        idx = torch.tensor([f * per + t for f in keep for t in range(per)])
        out.append(
            {
                "k": c["k"].index_select(1, idx),
                "v": c["v"].index_select(1, idx),
                "positions": [c["positions"][f] for f in keep],
                "frames": [c["frames"][f] for f in keep],
                "chunk_ids": [c["chunk_ids"][f] for f in keep],
            }
        )
    return out


def _causal_kv_trim_rolling_window(
    cache_list, *, frames_per_chunk, window_chunks, fixed_initial_anchor=False
):
    """Mirrors ``_causal_kv_trim_rolling_window``: anchor + the last window_chunks-1 chunks."""
    max_frames = 1 + max(0, int(window_chunks) - 1) * int(frames_per_chunk)
    total = len(cache_list[0]["frames"])
    if total <= max_frames:
        return cache_list
    return _causal_kv_slice(cache_list, [total - max_frames + k for k in range(max_frames)])


def _causal_dmd_validation_transition(
    scheduler, model_output, timestep, sample, *, next_timestep=None, renoise=None
):
    """Mirrors ``_causal_dmd_validation_transition``: x0, re-noised to the next step."""
    x0 = scheduler.step(model_output, timestep, sample, to_final=True)
    if next_timestep is None:
        return x0
    return scheduler.add_noise(x0, renoise, next_timestep)


def _run_causal_kv_rollout(
    unwrapped_model,
    args,
    data,
    val_dataset,
    handler,
    history_latents,
    H_lat,
    W_lat,
    H_img,
    W_img,
    vae_decode_tiled,
    num_validation_blocks,
    latent_window_size,
    use_mosaic,
    batch_idx,
    accelerator=None,
):
    """Mirrors ``_run_causal_kv_rollout``: C0 seeds the KV cache and the memory bank; each
    chunk selects context, denoises over ``schedule`` with CFG, writes its KV at t=0, is
    decoded and registered back into memory when a later chunk can use it."""
    pipe = unwrapped_model.pipe
    device, dtype, dit = pipe.device, pipe.torch_dtype, pipe.dit
    cs = int(args.causal_chunk_size)
    ccc = int(args.causal_context_chunks) or latent_window_size // cs
    total_chunks = num_validation_blocks * (latent_window_size // cs)
    mode = _normalize_causal_validation_memory_mode(args.causal_validation_memory_mode)
    cfg_scale = float(args.validation_cfg_scale) if args.causal_dmd_validation_use_cfg else 1.0

    def _enc(p):
        ids, mask = pipe.tokenizer(p, return_mask=True, add_special_tokens=True)
        return pipe.text_encoder(ids.to(device), mask.to(device))

    context = _enc(data.get("prompt") or "")
    if cfg_scale != 1.0:
        context = torch.cat([_enc(args.validation_negative_prompt), context], 0)
    noisy = data["noisy_latent_indices"].clone()
    extr_parts, intr_parts = [], []
    for s in range(num_validation_blocks):
        cam = val_dataset.read_camera_params(
            {"noisy_latent_indices": noisy + s * latent_window_size},
            info=data["info"],
            lookup={},
        )
        extr_parts.append(cam["noisy_latent_indices_prope_extrinsic"])
        intr_parts.append(cam["noisy_latent_indices_prope_intrinsic"])
    full_extr, full_intr = torch.cat(extr_parts), torch.cat(intr_parts)
    camera_info = WAN_VIDEO_PROPE_CAMERA_UNIT.process(
        pipe=None, noisy_latent_indices_prope_extrinsic=full_extr
    )["camera_info"]
    initial_c0 = history_latents[:, :, -1:].to(device=device, dtype=dtype)
    c0_frames = _decode_latents_to_numpy_frames(pipe, initial_c0, device, tiled=vae_decode_tiled)
    pool, _, _ = _build_initial_causal_kv_dynamic_context_pool(
        args=args,
        data=data,
        pipe=pipe,
        device=device,
        H_img=H_img,
        W_img=W_img,
        total_chunks=total_chunks,
        frames_per_chunk=cs,
        full_noisy_extr=full_extr.numpy(),
        initial_c0_frames=c0_frames,
        initial_anchor_latent=initial_c0,
        generated_context_publish_interval=1,
        tiled=vae_decode_tiled,
    )
    memory = None
    if use_mosaic and mode != "empty":
        handler.register_source_sequence(
            device,
            c0_frames,
            extrinsics=data["clean_latent_indices_prope_extrinsic"].numpy(),
            intrinsics=data["clean_latent_indices_prope_intrinsic"].numpy(),
            start_index=0,
            force_using_input_extrinics=True,
        )
        memory = _encode_frames_per_frame(pipe, c0_frames, device, tiled=vae_decode_tiled)
    rolling = init_causal_kv_caches(len(dit.blocks))
    model_fn_causal_kv(
        dit,
        latents_chunk=initial_c0,
        timestep_frames=torch.zeros(1),
        context=context,
        camera_info=camera_info,
        cur_positions=[1],
        cur_frames=[0],
        caches=rolling,
        write_cache=True,
        cur_cache_chunk_ids=[-1],
    )
    scheduler = pipe.scheduler
    steps, _ = prepare_causal_dmd_eval_scheduler(
        scheduler,
        args.causal_dmd_denoising_step_list,
        timestep_wrap=True,
        device=device,
        model_dtype=dtype,
    )
    all_clean = []
    for i in range(total_chunks):
        _rolling_anchor_source_position(
            local_chunk_idx=i,
            frames_per_chunk=cs,
            window_chunks=ccc,
            initial_anchor_source_position=0,
        )
        cur_pos = [1 + i * cs + k + 1 for k in range(cs)]
        cur_fr = [1 + i * cs + k for k in range(cs)]
        rgb = slice(i * cs * 4, (i + 1) * cs * 4)
        m_i = None
        if memory is not None:
            q = handler.align_w2c_trajectory(full_extr[rgb].numpy())
            m_i = handler.query_hits_mode_new(device, q, memory[0], memory_K=None)[None]
        context_cache = None
        if pool is not None:
            entries = pool.select_for_chunk(
                i, full_extr[rgb].numpy(), max_source_position_exclusive=None
            )
            if entries:
                context_cache = init_causal_kv_caches(len(dit.blocks))
                model_fn_causal_kv(
                    dit,
                    latents_chunk=torch.cat([e["latent"] for e in entries], 2),
                    timestep_frames=torch.zeros(len(entries)),
                    context=context,
                    camera_info=camera_info,
                    cur_positions=[e["position"] for e in entries],
                    cur_frames=[e["camera_frame"] for e in entries],
                    caches=context_cache,
                    write_cache=True,
                    cur_cache_chunk_ids=[i] * len(entries),
                )
        read_cache = _causal_kv_concat_caches(context_cache, rolling)
        gen = torch.Generator().manual_seed(int(args.validation_seed) + batch_idx * 1000 + i)
        cur = torch.randn(1, history_latents.shape[1], cs, H_lat, W_lat, generator=gen)
        for j, t in enumerate(steps):
            pred = model_fn_causal_kv(
                dit,
                latents_chunk=cur,
                timestep_frames=torch.full((cs,), float(t)),
                context=context,
                camera_info=camera_info,
                cur_positions=cur_pos,
                cur_frames=cur_fr,
                caches=read_cache,
                mosaic_latent=m_i,
                cache_read_chunk_id=i,
                write_cache=False,
            )
            if cfg_scale != 1.0:
                neg, pos = pred.chunk(2, dim=0)
                pred = neg + cfg_scale * (pos - neg)
            nxt = steps[j + 1] if j + 1 < len(steps) else None
            cur = _causal_dmd_validation_transition(
                scheduler,
                pred,
                t,
                cur,
                next_timestep=nxt,
                renoise=torch.randn(cur.shape, generator=gen) if nxt is not None else None,
            )
        model_fn_causal_kv(
            dit,
            latents_chunk=cur,
            timestep_frames=torch.zeros(cs),
            context=context,
            camera_info=camera_info,
            cur_positions=cur_pos,
            cur_frames=cur_fr,
            caches=read_cache,
            mosaic_latent=m_i,
            cache_read_chunk_id=i,
            write_cache=True,
        )
        all_clean.append(cur.detach().cpu())
        tail = _causal_kv_slice(
            read_cache, range(len(read_cache[0]["frames"]) - cs, len(read_cache[0]["frames"]))
        )
        rolling = _causal_kv_concat_caches(rolling, tail)
        rolling = _causal_kv_trim_rolling_window(rolling, frames_per_chunk=cs, window_chunks=ccc)
        has_consumer = i + 1 < total_chunks and mode == "c0_plus_generated"
        if not has_consumer:
            continue
        prev = initial_c0.cpu() if i == 0 else all_clean[-2][:, :, -1:]
        frames = _decode_generated_chunk_from_prefix_latents(
            pipe,
            torch.cat([prev, cur.cpu()], 2),
            noisy_start=0,
            noisy_count=cs,
            device=device,
            tiled=vae_decode_tiled,
            context="[causal-kv] generated chunk decode",
        )
        if pool is not None:
            pool.add_generated_chunk(
                pipe=pipe,
                generated_frames=frames,
                chunk_idx=i,
                frames_per_chunk=cs,
                rgb_start=i * cs * 4,
                full_noisy_extr=full_extr.numpy(),
                full_noisy_intr=full_intr.numpy(),
                device=device,
                tiled=vae_decode_tiled,
            )
        if memory is not None:
            new = _encode_frames_per_frame(pipe, frames, device, tiled=vae_decode_tiled)
            handler.register_source_sequence(
                device,
                frames,
                extrinsics=full_extr[rgb].numpy(),
                intrinsics=full_intr[rgb].numpy(),
                force_using_input_extrinics=True,
            )
            memory = torch.cat([memory, new], 2)
    history = torch.cat([initial_c0.cpu(), *all_clean], 2)
    scheduler.set_timesteps(1000, training=False)
    return history, history
