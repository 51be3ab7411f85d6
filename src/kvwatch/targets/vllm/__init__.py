"""kvwatch.targets.vllm: vLLM served (black-box and white-box) and its scheduler in process."""
