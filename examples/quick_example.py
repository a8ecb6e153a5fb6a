"""The README's quick example: a JSON object matching a schema, streamed as it is generated.

Run: python -m interlock.examples.quick_example     (prints {"name":"Ada Lovelace","age":36})

tests/examples/test_quick_example.py runs this file and checks that answer. Its model lane runs
torch at 1 thread (this main thread runs torch at its default, more than 1); call
torch.set_num_threads(1) before from_pretrained to give the lane 2 (engine/build.py lane_threads).
"""
import anyio

from interlock import Engine, JsonSchema, SamplingParams

schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


async def main() -> None:
    async with Engine.from_pretrained("smollm2-135m-instruct", speculative="ngram+forced") as engine:
        messages = [{"role": "user", "content": "Ada Lovelace died at the age of 36. Reply as JSON."}]
        async for delta in engine.generate(messages, grammar=JsonSchema(schema),
                                           sampling=SamplingParams(temperature=0.0)):
            print(delta.text, end="", flush=True)
        print()


if __name__ == "__main__":
    anyio.run(main)
