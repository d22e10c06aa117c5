from metaq.broker.main import main

main()
