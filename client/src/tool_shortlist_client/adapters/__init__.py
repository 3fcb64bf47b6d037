"""Framework adapters (install the matching extra):

- :mod:`.langgraph`: LangGraph bigtool ``retrieve_tools_function`` / ``retrieve_tools_coroutine``
  (``tool-shortlist-client[langgraph]``).
- :mod:`.langchain`: LangChain v1 agent middleware, ``ShortlistMiddleware`` for ``create_agent``
  (``tool-shortlist-client[langchain]``).
- :mod:`.openai`: Responses API / Agents SDK client-executed tool search
  (``tool-shortlist-client[openai]``).
- :mod:`.anthropic`: Claude custom tool search with ``tool_reference`` blocks
  (``tool-shortlist-client[anthropic]``).

Each module imports its framework lazily only where it needs its types, so the client itself
never requires them.
"""
