"""Run setup: the RunContext built once from the profile (platform, tokenizer, prompts, reward,
worker groups), model paths, and greedy evaluation outside the workers."""
