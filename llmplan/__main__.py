from llmplan.cli import main

main()
