"""`/problems/{code}`: a short page per problem code, for people who follow a problem's `type` or `code`. No key:
it says nothing about anyone's data. The codes and their meanings are `monologue.problems.PROBLEMS`."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.responses import PlainTextResponse

from monologue.problems import PROBLEMS, ProblemCode, problem_type

router = APIRouter(prefix="/problems", tags=["problems"])


@router.get("/{code}", response_class=PlainTextResponse, include_in_schema=False)
def problem_page(code: str) -> str:
    """What the code means, its HTTP status, and its `type` URI."""
    try:
        known = ProblemCode(code)
    except ValueError:
        raise HTTPException(404, f"no problem code {code!r}; the codes: {', '.join(ProblemCode)}") from None
    kind = PROBLEMS[known]
    return f"{known.value} (HTTP {kind.status})\n\n{kind.summary}\n\ntype: {problem_type(known)}\n"
