"""Block-quantized weights on the CPU: formats (GGUF Q4_0/Q4_1/Q8_0 and float checkpoints
quantized the same way), the QuantLinear layer, and loading a GGUF file's own blocks."""
