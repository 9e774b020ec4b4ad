"""Check a vLLM server's command line with the installed vLLM's own parser. Standard library only.

Run it with the venv's python before a unit is written: it builds the parser vLLM's API server
builds (``make_arg_parser(FlexibleArgumentParser())``), parses the words after the module name
of the ExecStart line, and runs vLLM's own pre-start checks (``validate_parsed_serve_args``).
Nothing is loaded or started. Exit 0 when vLLM accepts the line, 1 with vLLM's message when it
does not, 2 when it cannot check (no ExecStart, no vLLM).

Example:
    /opt/vllm-fleet/venv/bin/python validate_args.py --name vllm-chat.service \\
        --exec-start '/opt/vllm-fleet/venv/bin/python -m vllm.entrypoints.openai.api_server …'
    /opt/vllm-fleet/venv/bin/python validate_args.py --unit /etc/systemd/system/vllm-chat.service
    /opt/vllm-fleet/venv/bin/python validate_args.py -- --model /m --max-model-len 512
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

#: Where vLLM keeps its ``serve`` parser, newest releases first.
PARSER_MODULES = ["vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"]
FLEXIBLE_MODULES = ["vllm.utils.argparse_utils", "vllm.utils"]
#: C-style escapes systemd resolves inside ExecStart= words.
_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "s": " ", "\\": "\\", '"': '"', "'": "'",
}


class Rejected(Exception):
    """vLLM's parser refused the arguments; the message is vLLM's own."""


def split_exec_start(line: str) -> list[str]:
    """Split an ExecStart= value into words by systemd's rules (quotes, escapes, %%, $$).

    Example:
        >>> split_exec_start('/bin/py -m m --a "x y" --b 50%% --c "{\\\\"k\\\\": 1}"')
        ['/bin/py', '-m', 'm', '--a', 'x y', '--b', '50%', '--c', '{"k": 1}']
    """
    words: list[str] = []
    index, size = 0, len(line)
    while index < size:
        while index < size and line[index].isspace():
            index += 1
        if index >= size:
            break
        word: list[str] = []
        quote = None
        while index < size:
            char = line[index]
            if quote is None and char.isspace():
                break
            if char in "\"'" and quote in (None, char):
                quote = None if quote else char
                index += 1
            elif char == "\\" and index + 1 < size:
                escaped, index = _escape(line, index + 1)
                word.append(escaped)
            else:
                word.append(char)
                index += 1
        words.append("".join(word).replace("%%", "%").replace("$$", "$"))
    return words


def _escape(line: str, index: int) -> tuple[str, int]:
    """The character a backslash escape at ``line[index]`` stands for, and the next index."""
    char = line[index]
    if char == "x" and index + 3 <= len(line):
        try:
            return chr(int(line[index + 1 : index + 3], 16)), index + 3
        except ValueError:
            pass
    return _ESCAPES.get(char, char), index + 1


def exec_start(unit_text: str) -> str:
    """The ExecStart= value of a unit's text ('' when there is none).

    Example:
        >>> exec_start("[Service]\\nExecStart=/bin/py -m m --port 1\\n")
        '/bin/py -m m --port 1'
    """
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            return line[len("ExecStart=") :]
    return ""


def server_words(words: list[str]) -> list[str]:
    """The words after ``python -m MODULE`` (or after ``vllm serve``).

    Example:
        >>> server_words(["/venv/bin/python", "-m", "vllm.x", "--port", "1"])
        ['--port', '1']
        >>> server_words(["/venv/bin/vllm", "serve", "/models/m", "--port", "1"])
        ['/models/m', '--port', '1']
        >>> server_words(["/venv/bin/python", "/h/vllm_serve.py", "--watch-head", "a:1", "--",
        ...               "--headless"])
        ['--headless']
    """
    if "-m" in words[:-1]:
        return words[words.index("-m") + 2 :]
    if len(words) > 1 and words[1] == "serve":
        return words[2:]
    if len(words) > 1 and words[1].endswith("/vllm_serve.py"):  # a group member's program
        return words[words.index("--") + 1 :] if "--" in words else words[2:]
    return words[1:]


def _import_first(names: list[str], attribute: str) -> Any:
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, attribute):
            return getattr(module, attribute)
    raise ImportError(f"none of {', '.join(names)} has {attribute}")


def build_parser() -> tuple[argparse.ArgumentParser, Callable[[argparse.Namespace], None] | None]:
    """vLLM's serve parser, whose errors raise :class:`Rejected`, and its post-parse check."""
    flexible = _import_first(FLEXIBLE_MODULES, "FlexibleArgumentParser")
    make_arg_parser = _import_first(PARSER_MODULES, "make_arg_parser")
    try:
        validate = _import_first(PARSER_MODULES, "validate_parsed_serve_args")
    except ImportError:
        validate = None
    parser = make_arg_parser(flexible(description="vLLM OpenAI-Compatible RESTful API server."))

    def error(message: str) -> None:
        raise Rejected(message)

    # argparse reports every problem through parser.error(), which would print usage and exit 2.
    parser.error = error  # type: ignore[method-assign]
    return parser, validate


def check(words: list[str]) -> str | None:
    """None when vLLM accepts ``words`` (the arguments after the module), else its message."""
    parser, validate = build_parser()
    try:
        args = parser.parse_args(words)
        if validate is not None:
            validate(args)
    except Rejected as error:
        return str(error)
    except (TypeError, ValueError, KeyError) as error:
        return str(error).removeprefix("Error: ")
    except SystemExit as stop:  # a flag such as --help or --version that ends the program
        return f"the arguments make vLLM exit ({stop.code}) instead of serving"
    return None


def main(argv: list[str] | None = None) -> int:
    """Check one command line; print what vLLM says."""
    argv = sys.argv[1:] if argv is None else argv
    words: list[str] | None = None
    if "--" in argv:
        at = argv.index("--")
        argv, words = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exec-start", help="the ExecStart= value of the unit to be written")
    parser.add_argument("--unit", help="a unit file whose ExecStart= to check")
    parser.add_argument("--name", default="the server", help="what to call it in messages")
    args = parser.parse_args(argv)
    if words is None:
        line = args.exec_start
        if line is None and args.unit:
            try:
                with open(args.unit, encoding="utf-8") as unit:
                    line = exec_start(unit.read())
            except OSError as error:
                print(f"validate_args: cannot read {args.unit}: {error.strerror}", file=sys.stderr)
                return 2
        if not line:
            print("validate_args: no ExecStart= to check", file=sys.stderr)
            return 2
        words = server_words(split_exec_start(line))
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    try:
        import vllm

        version = getattr(vllm, "__version__", "?")
        problem = check(words)
    except ImportError as error:
        print(f"validate_args: cannot import vLLM's parser with {sys.executable}: {error}",
              file=sys.stderr)
        return 2
    if problem is not None:
        print(f"vLLM {version} rejects the command line of {args.name}: {problem}",
              file=sys.stderr)
        return 1
    print(f"vLLM {version} accepts the command line of {args.name} ({len(words)} words)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
