from llmkit.cli import main

main()
