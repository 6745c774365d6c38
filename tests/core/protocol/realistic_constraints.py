"""Large constraints real clients send, for the grammar engine's limits (``dyn.core.protocol.grammar``):
``test_grammar.py`` checks that each compiles and samples under the limits, and
``tests/perf/bench_grammar.py --fuel`` measures the least lexer fuel each needs.

``ORDER_SCHEMA`` is a 40-property nested object (an order record with customer, addresses, line
items, payment and audit trail: formats, patterns, enums, nullable fields, arrays of objects);
``AGENT_TOOLS`` the tool set of a coding agent (shell, file read/write/edit, search, web, tasks,
notebooks), each one as an OpenAI ``tools`` entry.
"""

from __future__ import annotations

from typing import Any

_ADDRESS = {
    "type": "object",
    "properties": {
        "line1": {"type": "string", "minLength": 1, "maxLength": 120},
        "line2": {"type": ["string", "null"], "maxLength": 120},
        "city": {"type": "string", "minLength": 1},
        "region": {"type": "string"},
        "postal_code": {"type": "string", "pattern": "^[A-Z0-9][A-Z0-9 -]{2,9}$"},
        "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
    },
    "required": ["line1", "city", "postal_code", "country"],
    "additionalProperties": False,
}

ORDER_SCHEMA: dict[str, Any] = {
    "$defs": {"address": _ADDRESS, "money": {"type": "number", "minimum": 0, "multipleOf": 0.01}},
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "format": "uuid"},
        "external_ref": {"type": ["string", "null"], "pattern": "^[A-Z]{3}-[0-9]{6,10}$"},
        "created_at": {"type": "string", "format": "date-time"},
        "updated_at": {"type": "string", "format": "date-time"},
        "status": {"enum": ["pending", "paid", "packed", "shipped", "delivered", "cancelled", "refunded"]},
        "channel": {"type": "string", "enum": ["web", "ios", "android", "store", "phone", "partner"]},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "locale": {"type": "string", "pattern": "^[a-z]{2}(-[A-Z]{2})?$"},
        "customer": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 1},
                "email": {"type": "string", "format": "email"},
                "name": {"type": "string", "minLength": 1, "maxLength": 80},
                "phone": {"type": ["string", "null"], "pattern": "^\\+[1-9][0-9]{7,14}$"},
                "tier": {"enum": ["basic", "silver", "gold", "platinum"]},
                "marketing_opt_in": {"type": "boolean"},
            },
            "required": ["id", "email", "name", "tier"],
            "additionalProperties": False,
        },
        "billing_address": {"$ref": "#/$defs/address"},
        "shipping_address": {"$ref": "#/$defs/address"},
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 50,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{2,4}-[0-9]{4,8}$"},
                    "title": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 999},
                    "unit_price": {"$ref": "#/$defs/money"},
                    "discount_pct": {"type": "number", "minimum": 0, "maximum": 100},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
                    "gift_wrap": {"type": "boolean"},
                },
                "required": ["sku", "quantity", "unit_price"],
                "additionalProperties": False,
            },
        },
        "subtotal": {"$ref": "#/$defs/money"},
        "tax": {"$ref": "#/$defs/money"},
        "shipping_cost": {"$ref": "#/$defs/money"},
        "total": {"$ref": "#/$defs/money"},
        "coupon_codes": {"type": "array", "items": {"type": "string", "pattern": "^[A-Z0-9]{4,12}$"}},
        "payment": {
            "type": "object",
            "properties": {
                "method": {"enum": ["card", "paypal", "bank_transfer", "gift_card", "cash"]},
                "card_brand": {"type": ["string", "null"], "enum": ["visa", "mastercard", "amex", None]},
                "last4": {"type": ["string", "null"], "pattern": "^[0-9]{4}$"},
                "authorized": {"type": "boolean"},
                "transaction_id": {"type": "string"},
            },
            "required": ["method", "authorized"],
            "additionalProperties": False,
        },
        "shipping": {
            "type": "object",
            "properties": {
                "carrier": {"enum": ["ups", "fedex", "dhl", "usps", "local"]},
                "service": {"type": "string"},
                "tracking_number": {"type": ["string", "null"]},
                "estimated_delivery": {"type": "string", "format": "date"},
                "weight_kg": {"type": "number", "exclusiveMinimum": 0},
            },
            "required": ["carrier"],
            "additionalProperties": False,
        },
        "notes": {"type": ["string", "null"], "maxLength": 500},
        "is_gift": {"type": "boolean"},
        "gift_message": {"type": ["string", "null"], "maxLength": 200},
        "priority": {"type": "integer", "minimum": 0, "maximum": 10},
        "risk_score": {"type": "number", "minimum": 0, "maximum": 1},
        "fraud_flags": {
            "type": "array",
            "items": {"enum": ["velocity", "geo_mismatch", "new_card", "proxy"]},
        },
        "loyalty_points_earned": {"type": "integer", "minimum": 0},
        "loyalty_points_used": {"type": "integer", "minimum": 0},
        "source_campaign": {"type": ["string", "null"]},
        "utm": {
            "type": "object",
            "properties": {
                "source": {"type": "string"},
                "medium": {"type": "string"},
                "campaign": {"type": "string"},
            },
            "additionalProperties": False,
        },
        "warehouse_id": {"type": "string", "pattern": "^WH[0-9]{2,3}$"},
        "fulfillment_sla_hours": {"type": "integer", "enum": [24, 48, 72, 120]},
        "return_window_days": {"type": "integer", "minimum": 0, "maximum": 365},
        "returnable": {"type": "boolean"},
        "attachments": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"url": {"type": "string", "format": "uri"}, "kind": {"type": "string"}},
                "required": ["url"],
            },
        },
        "history": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "at": {"type": "string", "format": "date-time"},
                    "event": {"type": "string"},
                    "actor": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                },
                "required": ["at", "event"],
            },
        },
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "version": {"type": "integer", "minimum": 1},
        "test_order": {"type": "boolean"},
        "sales_rep": {"type": ["string", "null"], "minLength": 2, "maxLength": 60},
        "estimated_ship_date": {"type": "string", "format": "date"},
    },
    "required": ["order_id", "created_at", "status", "currency", "customer", "items", "total"],
    "additionalProperties": False,
}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}

AGENT_TOOLS: list[dict[str, Any]] = [
    _tool(
        "bash",
        "Run a shell command in the workspace.",
        {
            "command": {**_STR, "description": "The command to run"},
            "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000},
            "description": _STR,
            "run_in_background": _BOOL,
        },
        ["command"],
    ),
    _tool(
        "read_file",
        "Read a file, optionally a window of lines.",
        {
            "file_path": _STR,
            "offset": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1},
        },
        ["file_path"],
    ),
    _tool(
        "write_file", "Write a whole file.", {"file_path": _STR, "content": _STR}, ["file_path", "content"]
    ),
    _tool(
        "edit_file",
        "Replace an exact string in a file.",
        {"file_path": _STR, "old_string": _STR, "new_string": _STR, "replace_all": _BOOL},
        ["file_path", "old_string", "new_string"],
    ),
    _tool(
        "multi_edit",
        "Several replacements in one file, applied in order.",
        {
            "file_path": _STR,
            "edits": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {"old_string": _STR, "new_string": _STR, "replace_all": _BOOL},
                    "required": ["old_string", "new_string"],
                    "additionalProperties": False,
                },
            },
        },
        ["file_path", "edits"],
    ),
    _tool("glob", "Find files by a glob pattern.", {"pattern": _STR, "path": _STR}, ["pattern"]),
    _tool(
        "grep",
        "Search file contents with a regular expression.",
        {
            "pattern": _STR,
            "path": _STR,
            "glob": _STR,
            "type": _STR,
            "output_mode": {"enum": ["content", "files_with_matches", "count"]},
            "-A": _INT,
            "-B": _INT,
            "-C": _INT,
            "-i": _BOOL,
            "-n": _BOOL,
            "multiline": _BOOL,
            "head_limit": {"type": "integer", "minimum": 1},
        },
        ["pattern"],
    ),
    _tool(
        "todo_write",
        "Replace the task list.",
        {
            "todos": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": _STR,
                        "content": {"type": "string", "minLength": 1},
                        "status": {"enum": ["pending", "in_progress", "completed"]},
                        "priority": {"enum": ["high", "medium", "low"]},
                    },
                    "required": ["id", "content", "status"],
                    "additionalProperties": False,
                },
            }
        },
        ["todos"],
    ),
    _tool(
        "web_fetch",
        "Fetch a URL and answer a question about it.",
        {"url": {"type": "string", "format": "uri"}, "prompt": _STR},
        ["url", "prompt"],
    ),
    _tool(
        "web_search",
        "Search the web.",
        {
            "query": {"type": "string", "minLength": 2},
            "allowed_domains": {"type": "array", "items": _STR},
            "blocked_domains": {"type": "array", "items": _STR},
        },
        ["query"],
    ),
    _tool(
        "task",
        "Hand a task to a sub-agent.",
        {
            "description": _STR,
            "prompt": _STR,
            "subagent_type": {"enum": ["general", "explore", "plan", "review"]},
        },
        ["description", "prompt", "subagent_type"],
    ),
    _tool(
        "notebook_edit",
        "Edit a Jupyter notebook cell.",
        {
            "notebook_path": _STR,
            "cell_id": _STR,
            "new_source": _STR,
            "cell_type": {"enum": ["code", "markdown"]},
            "edit_mode": {"enum": ["replace", "insert", "delete"]},
        },
        ["notebook_path", "new_source"],
    ),
    _tool(
        "str_replace_editor",
        "View, create and edit files.",
        {
            "command": {"enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
            "path": _STR,
            "file_text": _STR,
            "old_str": _STR,
            "new_str": _STR,
            "insert_line": {"type": "integer", "minimum": 0},
            "view_range": {"type": "array", "items": _INT, "minItems": 2, "maxItems": 2},
        },
        ["command", "path"],
    ),
    _tool(
        "ask_user",
        "Ask the user a question with suggested answers.",
        {
            "question": _STR,
            "options": {
                "type": "array",
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {"label": _STR, "description": _STR},
                    "required": ["label"],
                },
            },
            "multi_select": _BOOL,
        },
        ["question"],
    ),
    _tool("exit_plan_mode", "Present the plan for approval.", {"plan": _STR}, ["plan"]),
    _tool(
        "kill_shell",
        "Stop a background shell.",
        {"shell_id": {"type": "string", "pattern": "^[a-z0-9]{6,12}$"}},
        ["shell_id"],
    ),
]
