"""polymorph as a Model Context Protocol server (`polymorph mcp`): coding agents (Claude Code, Codex
CLI, Gemini CLI, Cursor, ...) read a running tune's groups and post candidates to its board.

view.py is the read-only view plus the one post path (no MCP SDK needed); server.py puts the SDK's
MCPServer in front of it; guide.py holds the texts; command.py the CLI subcommand."""
