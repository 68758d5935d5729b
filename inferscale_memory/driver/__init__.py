"""The driver: every use of vLLM beyond the connector base API, split by the process it
runs in.

- :mod:`.frontend`: the user's process (starting ``AsyncLLM``, its environment and
  settings, sampling parameters, tool parsing, vLLM's errors).
- :mod:`.engine`: vLLM's engine core and worker processes (the plugin hook vLLM runs in
  each, the model's attention layers, cache writer, rotary embedding and fp8 scales, pool
  budgets).
- :mod:`.scheduling`: vLLM's scheduler records (requests, block ids, a step's scheduled
  requests, the workers' load errors) read into the connector's plain views
  (:mod:`inferscale_memory.connector.step`).
- :mod:`.tool_parsing`: vLLM's tool parsers, as :mod:`inferscale_memory.tools` uses them.

The connector (:mod:`inferscale_memory.connector`) is the class vLLM instantiates; it
reads the loaded model through :mod:`.engine`. ``tests/test_vllm_contract.py`` lists
every private or version-specific vLLM name the package reads, with the file that reads it.
"""
