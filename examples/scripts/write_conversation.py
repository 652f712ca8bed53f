#!/usr/bin/env python3
"""Writes examples/data/tool-conversation.json: a long tool-calling conversation of our own
writing, the example of a conversation eval text.

A stage manager prepares rehearsals of Romeo and Juliet, Richard III and The Taming of the Shrew
with an assistant that has four tools (JSON Schema definitions below): it searches the plays'
lines, reads passages, counts a character's speeches and books rehearsals. The assistant thinks
(reasoning), calls tools (several calls in one turn, arguments of every JSON type), reads their
results and answers. The tool results quote the plays from examples/data/tinyshakespeare.txt
(public domain), taken from the first 90% of the file, the part the example models were trained
on, so the text around the tool calls is what the models know and the tool-call markup is what
they do not.

    python3 examples/scripts/write_conversation.py
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.normpath(os.path.join(HERE, "..", "data"))

with open(os.path.join(DATA, "tinyshakespeare.txt"), encoding="utf-8") as f:
    LINES = f.read().split("\n")
TRAINED = int(len(LINES) * 0.9)


def passage(start, n):
    """Lines start..start+n-1 (1-based), as the get_passage tool returns them."""
    assert start + n - 1 <= TRAINED, "only the part the example models were trained on"
    return "\n".join(LINES[start - 1:start - 1 + n])


def find(text, after=1):
    """The 1-based line number of the first line at or after `after` holding `text`."""
    for i in range(after - 1, TRAINED):
        if text in LINES[i]:
            return i + 1
    raise SystemExit(f"not found: {text!r}")


def search(query, limit):
    hits = [(i + 1, LINES[i]) for i in range(TRAINED) if query.lower() in LINES[i].lower()]
    return {"query": query, "matches": [{"line": n, "text": t} for n, t in hits[:limit]], "total": len(hits)}


def speeches(character):
    return sum(1 for i in range(TRAINED) if LINES[i] == character + ":")


TOOLS = [
    {"type": "function", "function": {
        "name": "search_lines",
        "description": "Find lines of the company's plays that contain a phrase (case-insensitive).",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "The phrase to look for."},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
        }, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "get_passage",
        "description": "Read consecutive lines of the plays' text, starting at a line number.",
        "parameters": {"type": "object", "properties": {
            "start_line": {"type": "integer", "minimum": 1},
            "n_lines": {"type": "integer", "minimum": 1, "maximum": 80},
        }, "required": ["start_line", "n_lines"]}}},
    {"type": "function", "function": {
        "name": "count_speeches",
        "description": "How many speeches a character has across the plays.",
        "parameters": {"type": "object", "properties": {
            "character": {"type": "string", "description": "The speaker's name as the text writes it, e.g. \"ROMEO\"."},
        }, "required": ["character"]}}},
    {"type": "function", "function": {
        "name": "book_rehearsal",
        "description": "Book the rehearsal room for a scene.",
        "parameters": {"type": "object", "properties": {
            "play": {"type": "string"},
            "scene": {"type": "string", "description": "Act and scene, e.g. \"II.2\"."},
            "date": {"type": "string", "format": "date"},
            "actors": {"type": "array", "items": {"type": "string"}},
            "hours": {"type": "number", "minimum": 0.5},
            "needs_fight_director": {"type": "boolean"},
        }, "required": ["play", "scene", "date", "actors"]}}},
]

calls = 0


def call(name, **arguments):
    global calls
    calls += 1
    return {"id": f"call_{calls}", "type": "function", "function": {"name": name, "arguments": arguments}}


def result(c, value):
    return {"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
            "content": value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}


def main():
    m = [{"role": "system", "content": "You are the stage manager's assistant for a small company rehearsing three plays: Romeo and Juliet, King Richard III and The Taming of the Shrew. Use the tools to look up the text; quote it exactly; keep bookings consistent."}]

    m.append({"role": "user", "content": "We start with the balcony scene on Monday. Find where Juliet asks why he must be Romeo, and give me the speech around it so the actors can learn it."})
    c1 = call("search_lines", query="wherefore art thou Romeo", max_results=5)
    m.append({"role": "assistant", "reasoning_content": "The line is Juliet's in the balcony scene. Search for it, then read the passage around the hit.", "content": "Let me find the line first.", "tool_calls": [c1]})
    m.append(result(c1, search("wherefore art thou Romeo", 5)))
    at = find("O Romeo, Romeo! wherefore art thou Romeo?")
    c2 = call("get_passage", start_line=at - 12, n_lines=40)
    m.append({"role": "assistant", "content": None, "tool_calls": [c2]})
    m.append(result(c2, passage(at - 12, 40)))
    m.append({"role": "assistant", "content": "Here is the speech, from Romeo's aside to Juliet's answer:\n\n" + passage(at - 1, 14) + "\n\nJuliet has the long speech; Romeo's interjections are short, so the actors can run it in one go."})

    m.append({"role": "user", "content": "Good. How many speeches do Romeo and Juliet each have? I want to split the line-learning fairly."})
    c3 = call("count_speeches", character="ROMEO")
    c4 = call("count_speeches", character="JULIET")
    m.append({"role": "assistant", "reasoning_content": "Two independent counts: call both at once.", "content": "", "tool_calls": [c3, c4]})
    m.append(result(c3, {"character": "ROMEO", "speeches": speeches("ROMEO")}))
    m.append(result(c4, {"character": "JULIET", "speeches": speeches("JULIET")}))
    m.append({"role": "assistant", "content": f"Romeo speaks {speeches('ROMEO')} times and Juliet {speeches('JULIET')} times in our text. Give Romeo the first sessions and Juliet the later ones, or split each scene in half."})

    m.append({"role": "user", "content": "Book the balcony scene (II.2) for Monday 2027-01-11, three hours, with Romeo, Juliet and the Nurse."})
    c5 = call("book_rehearsal", play="Romeo and Juliet", scene="II.2", date="2027-01-11", actors=["Romeo", "Juliet", "Nurse"], hours=3.0, needs_fight_director=False)
    m.append({"role": "assistant", "reasoning_content": "No fight in II.2, so no fight director. Hours as a number.", "content": "Booking it now.", "tool_calls": [c5]})
    m.append(result(c5, {"ok": True, "booking": "R-0111-A", "room": "Studio 2", "from": "10:00", "to": "13:00"}))
    m.append({"role": "assistant", "content": "Booked: Studio 2, Monday 11 January 2027, 10:00 to 13:00, reference R-0111-A, for Romeo, Juliet and the Nurse."})

    m.append({"role": "user", "content": "Now Richard. The opening soliloquy: read me the whole of it, and tell me where it ends."})
    at = find("Now is the winter of our discontent")
    c6 = call("search_lines", query="Now is the winter of our discontent", max_results=3)
    m.append({"role": "assistant", "reasoning_content": "Find the first line, then read enough lines to reach Clarence's entrance.", "content": None, "tool_calls": [c6]})
    m.append(result(c6, search("Now is the winter of our discontent", 3)))
    c7 = call("get_passage", start_line=at - 2, n_lines=45)
    m.append({"role": "assistant", "content": "Found it; reading the soliloquy.", "tool_calls": [c7]})
    m.append(result(c7, passage(at - 2, 45)))
    m.append({"role": "assistant", "content": "The soliloquy runs from \"Now is the winter of our discontent\" to Clarence's entrance. In full:\n\n" + passage(at, 40)})

    m.append({"role": "user", "content": "The duel in Romeo and Juliet needs the fight director. Find where Mercutio is hurt and book III.1 for Wednesday with Romeo, Mercutio, Tybalt and Benvolio, four hours."})
    at = find("I am hurt.")
    c8 = call("search_lines", query="I am hurt", max_results=5)
    c9 = call("book_rehearsal", play="Romeo and Juliet", scene="III.1", date="2027-01-13", actors=["Romeo", "Mercutio", "Tybalt", "Benvolio"], hours=4, needs_fight_director=True)
    m.append({"role": "assistant", "reasoning_content": "Search and booking do not depend on each other; do both. The fight needs the director.", "content": "Searching and booking together.", "tool_calls": [c8, c9]})
    m.append(result(c8, search("I am hurt", 5)))
    m.append(result(c9, {"ok": True, "booking": "R-0113-F", "room": "Main stage", "from": "14:00", "to": "18:00", "fight_director": "confirmed"}))
    c10 = call("get_passage", start_line=at - 20, n_lines=50)
    m.append({"role": "assistant", "content": None, "tool_calls": [c10]})
    m.append(result(c10, passage(at - 20, 50)))
    m.append({"role": "assistant", "content": "Mercutio is hurt under Romeo's arm:\n\n" + passage(at - 3, 12) + "\n\nBooked on the main stage, Wednesday 13 January, 14:00 to 18:00 (R-0113-F), fight director confirmed."})

    m.append({"role": "user", "content": "Last, the Shrew. Petruchio's wooing of Katharina: find the first exchange between them and read it."})
    at = find("Good morrow, Kate; for that's your name, I hear.")
    c11 = call("search_lines", query="Good morrow, Kate", max_results=5)
    m.append({"role": "assistant", "reasoning_content": "Their first meeting starts with Petruchio's greeting. Search for it.", "content": "", "tool_calls": [c11]})
    m.append(result(c11, search("Good morrow, Kate", 5)))
    c12 = call("get_passage", start_line=at - 1, n_lines=60)
    m.append({"role": "assistant", "content": "Reading the scene from his greeting.", "tool_calls": [c12]})
    m.append(result(c12, passage(at - 1, 60)))
    m.append({"role": "assistant", "content": "The wooing begins:\n\n" + passage(at - 1, 24) + "\n\nIt is quick verse; rehearse it at speed."})

    m.append({"role": "user", "content": "Before I forget: Richard's wooing of Anne over the coffin. Find where he gloats about it afterwards and read me the scene leading up to that line."})
    at = find("Was ever woman in this humour woo'd?")
    c20 = call("search_lines", query="in this humour woo'd", max_results=5)
    m.append({"role": "assistant", "reasoning_content": "The gloating line closes the wooing; read back from it.", "content": "Searching.", "tool_calls": [c20]})
    m.append(result(c20, search("in this humour woo'd", 5)))
    c21 = call("get_passage", start_line=at - 70, n_lines=72)
    m.append({"role": "assistant", "content": None, "tool_calls": [c21]})
    m.append(result(c21, passage(at - 70, 72)))
    m.append({"role": "assistant", "content": "The scene builds to Richard alone:\n\n" + passage(at, 12) + "\n\nIt needs Anne and Richard only; the bearers can be walked through separately."})

    m.append({"role": "user", "content": "And the prologue to the brawl in Romeo and Juliet, where Tybalt finds Benvolio with his sword drawn. Read it, then tell me who is on stage."})
    at = find("What, art thou drawn among these heartless hinds?")
    c22 = call("get_passage", start_line=at - 40, n_lines=70)
    c23 = call("count_speeches", character="TYBALT")
    m.append({"role": "assistant", "reasoning_content": "I know roughly where it is from the first scene; read a wide passage, and count Tybalt's speeches for the casting note.", "content": "Reading the first scene and counting Tybalt's speeches.", "tool_calls": [c22, c23]})
    m.append(result(c22, passage(at - 40, 70)))
    m.append(result(c23, {"character": "TYBALT", "speeches": speeches("TYBALT")}))
    m.append({"role": "assistant", "content": "Tybalt enters on:\n\n" + passage(at - 2, 10) + f"\n\nOn stage: Sampson, Gregory, Abraham, Balthasar, Benvolio and Tybalt, then the citizens and the heads of both houses. Tybalt has {speeches('TYBALT')} speeches in all."})

    m.append({"role": "user", "content": "One more for Monday: Romeo's lines before Juliet appears at the window. Read from \"But, soft!\" and add it to the booking notes."})
    at = find("But, soft! what light through yonder window breaks?")
    c24 = call("get_passage", start_line=at - 2, n_lines=60)
    m.append({"role": "assistant", "content": "Reading Romeo's speech.", "tool_calls": [c24]})
    m.append(result(c24, passage(at - 2, 60)))
    m.append({"role": "assistant", "content": "Romeo's speech, for Monday's notes:\n\n" + passage(at, 25)})

    m.append({"role": "user", "content": "Book it for Friday 2027-01-15, two and a half hours, Petruchio and Katharina. Then summarise the week."})
    c13 = call("book_rehearsal", play="The Taming of the Shrew", scene="II.1", date="2027-01-15", actors=["Petruchio", "Katharina"], hours=2.5, needs_fight_director=False)
    m.append({"role": "assistant", "content": None, "tool_calls": [c13]})
    m.append(result(c13, {"ok": True, "booking": "R-0115-B", "room": "Studio 1", "from": "10:00", "to": "12:30"}))
    m.append({"role": "assistant", "reasoning_content": "Three bookings made: Monday, Wednesday, Friday. List them in order.", "content": "The week:\n\n- Monday 11 January, Studio 2, 10:00-13:00: Romeo and Juliet II.2 (Romeo, Juliet, Nurse), R-0111-A.\n- Wednesday 13 January, main stage, 14:00-18:00: Romeo and Juliet III.1 with the fight director (Romeo, Mercutio, Tybalt, Benvolio), R-0113-F.\n- Friday 15 January, Studio 1, 10:00-12:30: The Taming of the Shrew II.1 (Petruchio, Katharina), R-0115-B.\n\nRichard's soliloquy has no booking yet."})

    doc = {"messages": m, "tools": TOOLS, "add_generation_prompt": False, "kwargs": {"enable_thinking": True}}
    out = os.path.join(DATA, "tool-conversation.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(m)} messages, {calls} tool calls -> {out}")


if __name__ == "__main__":
    main()
