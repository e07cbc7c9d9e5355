"""The colocated vLLM engine: being written."""
