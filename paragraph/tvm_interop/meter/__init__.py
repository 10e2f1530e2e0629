"""Measuring built programs, here or on a device behind TVM's RPC tracker: IOS's stages
(`stages`), the search's kernel signatures (`signatures`) and the remote device (`remote`)."""
