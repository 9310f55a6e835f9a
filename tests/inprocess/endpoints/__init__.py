"""Each API's Endpoint object on its own: its checks, its stream tap, its cache question and replay."""
