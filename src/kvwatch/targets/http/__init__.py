"""Any OpenAI-compatible server as a black-box gate target: its API and its gauges."""
