"""What every section of the schema shares: strict keys, a rule across a section's keys, a key error that names
the full dotted key, user paths, and the keys GluonCV has but nothing here provides."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from trainer.errors import UserError

# GluonCV spells it WOLRD_URLS; WORLD_URLS is accepted on input, WOLRD_URLS is what we write.
URLS_KEY, URLS_ALIAS = "WOLRD_URLS", "WORLD_URLS"


class ConfigError(UserError, ValueError):
    """An invalid configuration; the message names the file and the dotted key(s) and says what to change."""


def _expand_user(value: str) -> str:
    return str(Path(value).expanduser()) if value.startswith("~") else value


# A path in the config: "~" is the home of the user running the trainer (each node's own, on a cluster).
UserPath = Annotated[str, AfterValidator(_expand_user)]


class _Section(BaseModel):
    # Strict: a quoted '16' is not an integer and 'yes' is not a boolean; YAML already gives the right types.
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    def _problem(self) -> tuple[str, str] | None:
        """A problem across this section's keys: (the key at fault, relative to the section; message), or None."""
        return None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        problem = self._problem()
        if problem is not None:
            raise _key_error(*problem)
        return self


def _only(inert: Any, reason: str) -> AfterValidator:
    """A key whose feature is not provided: only GluonCV's no-op value loads, anything else is refused by name."""

    def check(value: Any) -> Any:
        if value != inert:
            raise PydanticCustomError("unsupported", reason)
        return value

    return AfterValidator(check)


def _key_error(key: str, message: str) -> PydanticCustomError:
    # The key (relative to the section that raises) travels in the context, so the message can name the full
    # dotted key, not only the section whose validator found the problem.
    return PydanticCustomError("key", "{key}: {message}", {"key": key, "message": message})


def _changed(section: BaseModel, key: str) -> bool:
    return getattr(section, key) != type(section).model_fields[key].get_default(call_default_factory=True)
