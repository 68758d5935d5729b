"""The driver: every use of vLLM beyond the connector base API, split by the process it
runs in.

- :mod:`.frontend`: the user's process (starting ``AsyncLLM``, its environment and
  settings, sampling parameters, tool parsing, vLLM's errors).
- :mod:`.engine`: vLLM's engine core and worker processes (the plugin hook vLLM runs in
  each, the model's attention layers, cache writer and rotary embedding, pool budgets).

The connector (:mod:`inferscale_memory.connector`) is the class vLLM instantiates; it
reads the loaded model through :mod:`.engine`. ``tests/test_vllm_contract.py`` lists
every private or version-specific vLLM name the package reads, with the file that reads it.
"""
