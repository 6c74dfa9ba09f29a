"""LLM agents: LoRA populations on one frozen base, batched rollouts and the GRPO learner."""
