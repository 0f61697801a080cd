"""The Textual chat app of `ninfer chat`. Import only when launching it (textual is slow to load)."""
