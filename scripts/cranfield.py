"""Convert the Cranfield collection (cran.all.1400, cran.qry, cranqrel, each plain or gzipped) into files
llmkit reads: docs.jsonl (for `rag index`), queries.jsonl and TREC qrels.txt (for `rag eval`, `rag tune`).
Without SRC it converts the copy shipped in examples/data/cranfield.

    python scripts/cranfield.py -o cran
    llmkit rag index cran-idx cran/docs.jsonl
    llmkit rag eval cran-idx --queries cran/queries.jsonl --qrels cran/qrels.txt
"""

import argparse
import os
import sys

from llmkit.errors import LlmkitError
from llmkit.rag.evaluate.datasets import import_cranfield

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "data", "cranfield")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default=os.path.normpath(SHIPPED),
                    help="directory holding cran.all.1400, cran.qry and cranqrel, plain or .gz "
                         "(default: examples/data/cranfield in this repository)")
    ap.add_argument("-o", "--output", required=True, help="directory to write")
    args = ap.parse_args()
    try:
        counts = import_cranfield(args.src, args.output)
    except LlmkitError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    print(f"{args.output}: {counts['docs']} documents, {counts['queries']} queries, {counts['judgments']} judgments",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
