# Sourced by the quant examples: the model (argument 1, else the packaged SmolLM2), a work directory
# removed on exit, and a text (argument 2, else the first $chars characters of the tests' kernel docs).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the repository, wherever this runs from
model=${1:-$(python3 -c 'from llmkit.llama.runtime import default_model_path as d; print(d())')}
text=${2:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$text" ]; then
  python3 -c "import gzip,sys; sys.stdout.write(gzip.open('$root/tests/fixtures/kernel-docs.txt.gz','rt').read()[:$chars])" > "$work/text.txt"
  text="$work/text.txt"
fi
