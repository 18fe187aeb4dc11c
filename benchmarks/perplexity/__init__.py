"""The parts of benchmarks/bench_perplexity.py:

windows.py           llama-perplexity's windows and scoring, from echoed log-probs
llama_perplexity.py  llama.cpp's llama-perplexity: its command line and its result
"""
