"""The ways into the engine: each door (the CLI, the MCP server, the HTTP server and its page, the
bot integrations, chat imports and exports) builds on the public API of :class:`narrmem.Memory`
only, never on a plugin or a private attribute."""
