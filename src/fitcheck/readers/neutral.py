"""Trainer-file keys known to leave a training step's GPU memory alone (schedules, data, logging, saving).

The ``--from`` report lists a file's unused keys in two lines: these, and the rest, which fitcheck does not
understand and ignores (a kernel switch, a newer option, a typo), so a user sees at once which keys might
change memory without fitcheck counting them. One table, by kind, over the formats' shared vocabulary
(transformers TrainingArguments, axolotl, LLaMA-Factory, TRL, DeepSpeed, accelerate); a dotted key is
looked up by its last part.
"""

from __future__ import annotations

#: Exact key names, by what they set.
# fmt: off
NEUTRAL: frozenset[str] = frozenset(
    {
        # optimizer hyperparameters and the schedule (values, not states)
        "learning_rate", "lr_scheduler", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio",
        "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "adam_eps",
        "max_grad_norm", "gradient_clipping", "cosine_min_lr_ratio", "cosine_constant_lr_ratio",
        "lr_quadratic_warmup", "eta_min", "loraplus_lr_ratio", "num_epochs", "num_train_epochs",
        "max_steps", "seed", "data_seed",
        # data: which rows, how they are tokenized (the sequence length is read elsewhere)
        "datasets", "dataset", "dataset_dir", "dataset_prepared_path", "dataset_name", "dataset_mixture",
        "dataset_mixer", "dataset_config", "dataset_splits", "dataset_train_split", "dataset_test_split",
        "dataset_kwargs", "dataset_num_proc", "dataset_processes", "preprocessing_num_workers",
        "dataloader_num_workers", "max_samples", "overwrite_cache", "val_set_size", "val_size", "template",
        "chat_template", "train_on_inputs", "special_tokens", "tokens", "eot_tokens", "eos_token",
        "shuffle_merged_datasets", "dataset_exact_deduplication", "tokenized_path", "remove_unused_columns",
        "tokenizer_type", "tokenizer_config", "tokenizer_use_fast", "tokenizer_legacy",
        "tokenizer_use_mistral_common", "skip_prepare_dataset", "assistant_only_loss",
        # where the model comes from and how it is fetched
        "model_type", "base_model_config", "is_llama_derived_model", "is_falcon_derived_model",
        "is_mistral_derived_model", "is_qwen_derived_model", "trust_remote_code", "model_revision",
        "revision_of_model", "hf_use_auth_token",
        "hub_model_id", "hub_strategy", "hub_private_repo", "hub_model_revision", "push_to_hub",
        "hub_always_push", "hub_token", "hub_revision",
        # logging, saving, evaluation schedule, launching
        "output_dir", "overwrite_output_dir", "logging_steps", "logging_strategy", "log_level", "report_to",
        "run_name", "plot_loss", "save_steps", "save_strategy", "save_total_limit", "save_only_model",
        "save_safetensors", "saves_per_epoch", "evals_per_epoch", "eval_steps", "eval_strategy",
        "evaluation_strategy", "do_eval", "do_train", "eval_table_size", "early_stopping_patience",
        "auto_resume_from_checkpoints", "resume_from_checkpoint", "ddp_timeout", "ddp_find_unused_parameters",
        "strict", "debug", "steps_per_print", "wall_clock_breakdown", "group_by_length",
        "average_tokens_across_devices", "eval_sample_packing", "lora_fan_in_fan_out",
        # kohya sd-scripts / kohya_ss: captions, buckets' bookkeeping, augmentation, noise and loss weighting,
        # sampling, saving and logging (library/train_util.py add_*_arguments @48d368f; kohya_gui fields)
        "caption_dropout_rate", "caption_dropout_every_n_epochs", "caption_tag_dropout_rate", "keep_tokens",
        "shuffle_caption", "caption_extension", "caption_metadata_filename", "latent_metadata_filename",
        "bucket_no_upscale", "bucket_reso_steps", "min_bucket_reso", "color_aug", "flip_aug", "random_crop",
        "lr_warmup", "lr_warmup_steps", "lr_scheduler_num_cycles", "lr_scheduler_power", "lr_scheduler_args",
        "epoch", "max_train_epochs", "max_train_steps", "dataset_repeats", "train_data_dir", "train_dir",
        "image_folder", "max_data_loader_n_workers", "persistent_data_loader_workers",
        "num_cpu_threads_per_process", "min_snr_gamma", "noise_offset", "noise_offset_type",
        "noise_offset_random_strength", "adaptive_noise_scale", "multires_noise_discount",
        "multires_noise_iterations", "ip_noise_gamma", "ip_noise_gamma_random_strength",
        "scale_v_pred_loss_like_noise_pred", "v_pred_like_loss", "debiased_estimation_loss",
        "prior_loss_weight",
        "min_timestep", "max_timestep", "huber_c", "huber_schedule", "huber_scale", "weighting_scheme",
        "logit_mean", "logit_std", "mode_scale", "timestep_sampling", "discrete_flow_shift",
        "sample_every_n_epochs", "sample_every_n_steps", "sample_sampler", "sample_prompts", "output_name",
        "save_model_as", "save_precision", "save_every_n_epochs", "save_every_n_steps", "save_last_n_steps",
        "save_last_n_steps_state", "save_last_n_epochs", "save_last_n_epochs_state", "save_state",
        "save_state_on_train_end", "save_state_to_huggingface", "save_as_bool", "async_upload", "logging_dir",
        "log_with", "log_config", "training_comment", "model_list", "skip_cache_check", "create_buckets",
        "create_caption", "generate_caption_database", "generate_image_buckets", "main_process_port",
        # LoRA scaling and initialisation: alpha / sqrt(r) instead of alpha / r, how adapters start (peft
        # LoraConfig use_rslora / init_lora_weights / alpha_pattern; axolotl peft_*, LLaMA-Factory, TRL)
        "use_rslora", "peft_use_rslora", "peft_init_lora_weights", "lora_alpha_pattern",
        "loraplus_lr_embedding",
        # evaluation-time generation and metrics (axolotl schemas/training.py: run at eval, not in a step)
        "eval_max_new_tokens", "eval_table_max_new_tokens", "do_causal_lm_eval", "eval_causal_lm_metrics",
        # which processor class prepares multimodal rows (axolotl schemas/model.py processor_type)
        "processor_type",
        # torchtune recipe bookkeeping (recipes/*.py @bd2a0fc7: cfg.epochs, cfg.shuffle, the checkpointer,
        # metric logger and peak-memory logging; the tokenizer's vocabulary files)
        "epochs", "shuffle", "checkpointer", "metric_logger", "log_every_n_steps", "log_peak_memory_stats",
        "save_adapter_weights_only", "merges_file", "merges_path", "vocab_path", "dataset_val",
        # litgpt (finetune/*.py setup, args.py TrainArgs / EvalArgs @26857050): where it saves and logs, the
        # schedule, the optimizer's hyperparameters (optimizer.init_args.*)
        "out_dir", "logger_name", "access_token", "save_interval", "log_interval", "min_lr", "max_time",
        "resume", "lr", "betas", "eps",
        # FSDP bookkeeping that changes neither shards nor prefetch
        "state_dict_type", "final_state_dict_type", "auto_wrap_policy", "transformer_layer_cls_to_wrap",
        "sync_module_states", "use_orig_params", "cpu_ram_efficient_loading",
        # DeepSpeed fp16 loss scaling and checks
        "hysteresis", "initial_scale_power", "loss_scale", "loss_scale_window", "min_loss_scale",
        "zero_allow_untested_optimizer",
    }
)
# fmt: on
#: Name prefixes of experiment trackers and loss watchdogs.
NEUTRAL_PREFIXES: tuple[str, ...] = (
    "wandb_",
    "use_wandb",
    "swanlab_",
    "use_swanlab",
    "use_tensorboard",
    "mlflow_",
    "comet_",
    "otel_",
    "use_otel",
    "loss_watchdog_",
)  # fmt: skip


#: Tables whose every entry is data selection (torchtune's ``dataset:`` / ``dataset_val:`` builders; the
#: ``packed`` entry, which does change the step, is read by the torchtune reader and never reaches here),
#: or litgpt's data module (``data.class_path`` / ``data.init_args``), evaluation schedule (``eval``:
#: ``EvalArgs``) and logger settings (``log``: ``LogArgs``).
NEUTRAL_TABLES: frozenset[str] = frozenset({"dataset", "dataset_val", "data", "eval", "log"})


def is_neutral(key: str) -> bool:
    """Whether a file key (dotted for nested ones) is known to leave the step's GPU memory alone."""
    last = key.rsplit(".", 1)[-1]
    bare = last.removeprefix("fsdp_")
    table = key.split(".", 1)[0] if "." in key else None
    return last in NEUTRAL or bare in NEUTRAL or last.startswith(NEUTRAL_PREFIXES) or table in NEUTRAL_TABLES
