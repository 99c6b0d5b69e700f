"""The local lab: tiny models, local engines (simulated or real vLLM CPU) and the pod bridge."""
