"""The server engine: an inference server (`vllm serve`, SGLang's server, any OpenAI-compatible
endpoint) in place of an engine inside each worker; fleet keeps its guarantees on top of it."""
