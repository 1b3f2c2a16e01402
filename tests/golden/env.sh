# environment for this plan: written by fitcheck 0.1.0 (fitcheck plan) for Llama 3.2 3B
# hardware: Apple M1 16GB (mps), budget 12.00 GiB = usable 12.00 GiB - headroom 0.00 GiB
# estimated peak: 5.56 GiB on the device (allocated peak 5.56 GiB in backward), likely up to 6.00 GiB (50% of the budget); regime hf
# plan: qlora, micro-batch 2 x accumulation 8 = 16, 1024 tokens, fp16, attention sdpa, adamw, checkpointing on; about 39 tokens/s
# run: source env.sh (bash or zsh), then start training
# reproduce: fitcheck plan llama-3.2-3b --on apple-m1-16gb --method qlora --seq-len 1024 --emit env.sh

# an operator MPS lacks runs on the CPU (slower, with a warning naming it) instead of stopping
# source: hardware_detection.md 3.7 (pytorch/pytorch#77764; docs mps_environment_variables)
export PYTORCH_ENABLE_MPS_FALLBACK=1

# lifts PyTorch's cap on MPS allocations. RISK: the run can push macOS into swap (about 10x slower) or freeze it. This plan needs 5.6 GiB of the 12.0 GiB working-set budget, under the default cap, so it stays off
# source: seeds/000 (Apple 2); hardware_detection.md 3.6 (0.0 'may cause system failure')
# export PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0
