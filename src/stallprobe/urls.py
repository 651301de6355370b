"""URLs as the probe reads them: split into host, port and path, `[host]:port` as a request's Host and a
line say it, and a URL's origin (where the engine's other routes are). Pure: the flags check a URL with it
without loading the socket module, which the HTTP client (scrape.py) needs.
"""

from __future__ import annotations

__all__ = ["hostport", "origin", "parse_url"]


def parse_url(url: str) -> tuple[str, int, str]:
    """Split `http://host[:port]/path` into host, port and path; ValueError says what is wrong."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "http":
        raise ValueError("must be an http:// URL")
    slash = rest.find("/")
    hostport, path = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    path = path.partition("#")[0]
    if "@" in hostport:
        raise ValueError("must not carry user information")
    if hostport.startswith("["):  # [::1]:8000
        close = hostport.find("]")
        if close < 0:
            raise ValueError("has an unclosed [ in its host")
        host, port_text = hostport[1:close], hostport[close + 1 :]
        if port_text and not port_text.startswith(":"):
            raise ValueError("has junk after its [host]")
        port_text = port_text[1:]
    else:
        host, _, port_text = hostport.partition(":")
    if not host:
        raise ValueError("has no host")
    if not host.isascii():
        try:
            host.encode("idna")  # what fetch() resolves; a name IDNA refuses can never be reached
        except UnicodeError:
            raise ValueError("has a host name that cannot be encoded for DNS") from None
    if not port_text:
        port = 80
    elif port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536:
        port = int(port_text)
    else:
        raise ValueError(f"has an invalid port {port_text!r}")
    if any(ch in url for ch in " \r\n\t"):
        raise ValueError("must not contain blanks or line breaks")
    return host, port, path


def hostport(host: str, port: int) -> str:
    """`host:port`, an IPv6 host in brackets (`[::1]:8000`)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def origin(url: str) -> str:
    """`http://host:port` of a URL: where the engine's other routes are."""
    slash = url.find("/", url.find("://") + 3)
    return url if slash < 0 else url[:slash]
