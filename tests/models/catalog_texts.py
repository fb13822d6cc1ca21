"""The smallest valid catalog, which both catalog test modules start from (and break on
purpose)."""

from __future__ import annotations

MINIMAL = """
[models.tiny]
name = "Tiny"
format = "gguf"
architecture = "llama"
size_bytes = 10
sha256 = "{sha}"

[models.tiny.sources.pypi]
package = "tiny-model"
version = "1.0"
member = "tiny_model/tiny.gguf"

[pairs.solo]
description = "One tiny model."

[pairs.solo.llamacpp]
target = "tiny"
""".replace("{sha}", "ab" * 32)
