"""Python client of the tool-shortlist service: typed sync and async calls, retries on 503,
errors carrying the service's ``error.type``; framework adapters in
:mod:`tool_shortlist_client.adapters`."""

from tool_shortlist_client.client import AsyncShortlistClient, ShortlistClient
from tool_shortlist_client.errors import (
    APIError,
    ConflictError,
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    ServerError,
    ServiceUnavailableError,
    ShortlistClientError,
    ToolsFileError,
    TransportError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
)
from tool_shortlist_client.models import (
    FeedbackResult,
    Registry,
    RegistryInfo,
    Shortlist,
    ShortlistTool,
    ToolCall,
    ToolReport,
    ToolUsage,
)
from tool_shortlist_client.names import (
    PROVIDER_NAMES,
    ProviderNames,
    UnknownProviderName,
    provider_name,
)

__all__ = [
    "PROVIDER_NAMES",
    "APIError",
    "AsyncShortlistClient",
    "ConflictError",
    "FeedbackResult",
    "ForbiddenError",
    "InvalidRequestError",
    "NotFoundError",
    "PayloadTooLargeError",
    "ProviderNames",
    "Registry",
    "RegistryInfo",
    "ServerError",
    "ServiceUnavailableError",
    "Shortlist",
    "ShortlistClient",
    "ShortlistClientError",
    "ShortlistTool",
    "ToolCall",
    "ToolReport",
    "ToolUsage",
    "ToolsFileError",
    "TransportError",
    "UnauthorizedError",
    "UnknownProviderName",
    "UnsupportedMediaTypeError",
    "provider_name",
]
