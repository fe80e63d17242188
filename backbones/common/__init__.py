"""What every layer of the suite shares: its error types, the logger, the commands' one-line errors and argument
checks, atomic files, image files and ImageNet-layout folders, and torchrun processes. It imports nothing else of the
suite."""
