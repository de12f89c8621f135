"""Built-in reward problems for language models, generated offline from a seed, and their verifiers.

- **arithmetic**: ``"37+45="`` -> the exact answer ``"82"``.
- **countdown** (the benchmark of "Evolution Strategies at Scale" and EGGROLL): ``"3 7 12>33:"`` -> an
  expression that uses each given number exactly once, with + - * / and parentheses, and equals the
  target: ``"7*3+12"`` is right, ``"12*3-3"`` is not (3 twice, 7 unused).

A verifier reads the prompt and the completion (the text up to the first newline) and returns a reward:
1.0 for a correct answer, 0.1 for a well-formed wrong one, 0.0 otherwise. Expressions are parsed by
:mod:`ast` and evaluated here with exact fractions over a whitelist of nodes: the model's text is never
``eval``-ed, and anything but numbers, the four operations and parentheses scores 0.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Callable
from fractions import Fraction

import torch

CORRECT, WELL_FORMED = 1.0, 0.1
_OPERATIONS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.Div: lambda a, b: None if b == 0 else a / b}
MAX_EXPRESSION = 64  # characters; a longer answer is not parsed


def answer_text(completion: str) -> str:
    """The answer part of a completion: its first line, stripped."""
    return completion.split("\n", 1)[0].strip()


def parse(expression: str) -> tuple[Fraction, list[int]] | None:
    """(exact value, the integer literals used) of an arithmetic expression, or None when it is not one
    (another node, a float, a division by zero, too long, a syntax error). Only decimal digits, ``+ - * /``,
    parentheses and spaces are read: Python's comments (``#``), hex (``0x7``) and digit separators (``1_2``)
    are not arithmetic."""
    if not expression or len(expression) > MAX_EXPRESSION or not re.fullmatch(r"[0-9+\-*/() ]+", expression):
        return None
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError):
        return None
    numbers: list[int] = []
    value = _value(tree.body, numbers)
    return None if value is None else (value, numbers)


def _value(node: ast.AST, numbers: list[int]) -> Fraction | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATIONS:
        left, right = _value(node.left, numbers), _value(node.right, numbers)
        if left is None or right is None:
            return None
        return _OPERATIONS[type(node.op)](left, right)
    return None  # names, calls, attributes, unary signs, floats, strings, ...: not an answer


def arithmetic_reward(prompt: str, completion: str) -> float:
    """1 for the exact integer answer of ``"a+b="`` (``+ - *``), 0.1 for another integer, else 0."""
    question = prompt.rstrip().removesuffix("=")
    expected = parse(question)
    answer = answer_text(completion)
    if expected is None:
        raise ValueError(f"not an arithmetic prompt: {prompt!r}; expected e.g. '37+45='")
    if not re.fullmatch(r"-?[0-9]{1,12}", answer):
        return 0.0
    return CORRECT if Fraction(int(answer)) == expected[0] else WELL_FORMED


def countdown_problem(prompt: str) -> tuple[list[int], int]:
    """The numbers and target of a countdown prompt ``"3 7 12>33:"``."""
    try:
        numbers, target = prompt.rstrip().removesuffix(":").split(">")
        return [int(n) for n in numbers.split()], int(target)
    except ValueError:
        raise ValueError(f"not a countdown prompt: {prompt!r}; expected e.g. '3 7 12>33:'") from None


def countdown_reward(prompt: str, completion: str) -> float:
    """1 when the answer uses each of the prompt's numbers exactly once (and no other) and equals the
    target; 0.1 for a well-formed expression that does not; else 0."""
    numbers, target = countdown_problem(prompt)
    parsed = parse(answer_text(completion))
    if parsed is None:
        return 0.0
    value, used = parsed
    available = list(numbers)
    for n in used:
        if n not in available:
            return WELL_FORMED
        available.remove(n)
    return CORRECT if value == target and not available else WELL_FORMED


def rewards_of(verifier: Callable[[str, str], float]) -> Callable[[list[str], list[str]], torch.Tensor]:
    """A reward function over lists (what :class:`~nesgpu.tasks.generation.GenerationTask` calls) from a
    verifier of one (prompt, completion), a pure function: within a call, each distinct pair is verified once
    (a population's members often give the same completion to a prompt)."""
    def reward(prompts: list[str], completions: list[str]) -> torch.Tensor:
        verified: dict[tuple[str, str], float] = {}
        for pair in zip(prompts, completions):
            if pair not in verified:
                verified[pair] = verifier(*pair)
        return torch.tensor([verified[pair] for pair in zip(prompts, completions)], dtype=torch.float32)
    reward.__name__ = verifier.__name__
    return reward


def arithmetic_problems(count: int, seed: int, digits: int = 2) -> list[tuple[str, str]]:
    """``count`` (prompt, answer) pairs ``"a+b="``, ``"a-b="`` or ``"a*b="`` with operands below
    ``10**digits`` (products: one operand below 10), a function of ``seed``."""
    rng = random.Random(seed)
    problems = []
    for _ in range(count):
        op = rng.choice("+-*")
        a = rng.randrange(10**digits)
        b = rng.randrange(10 if op == "*" else 10**digits)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        problems.append((f"{a}{op}{b}=", str(value)))
    return problems


def countdown_problems(count: int, seed: int, numbers: int = 3, high: int = 12) -> list[tuple[str, str]]:
    """``count`` (prompt, one solution) pairs: ``numbers`` numbers in [1, high] and a positive integer target
    reached by an expression that uses each of them once, a function of ``seed``."""
    rng = random.Random(seed)
    problems = []
    while len(problems) < count:
        values = [rng.randint(1, high) for _ in range(numbers)]
        expression = str(values[0])
        for v in values[1:]:
            op = rng.choice("+-*")
            expression = f"({expression}){op}{v}" if op == "*" and ("+" in expression or "-" in expression) \
                else f"{expression}{op}{v}"
        value = parse(expression)[0]
        if value.denominator == 1 and value > 0:
            problems.append((f"{' '.join(map(str, values))}>{int(value)}:", expression))
    return problems


__all__ = ["CORRECT", "WELL_FORMED", "answer_text", "arithmetic_problems", "arithmetic_reward", "countdown_problem",
           "countdown_problems", "countdown_reward", "parse", "rewards_of"]
