"""The near-miss verifier: between "cosine >= threshold" and "serve".

Embeddings place "convert km to miles" and "convert miles to km" at cosine 0.99: the words are the same,
the answer is not. This check compares what changes an answer (numbers, units and their order,
negation, polar words, times, comparatives, named entities, and any small substitution of a content
word) and names the first difference it finds. It is plain Python on two short strings: tens of
microseconds. It works on English and Korean text (particles stripped, Korean cue words listed).
"""

from __future__ import annotations

import difflib
import itertools
import os
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

# -- lexicons -----------------------------------------------------------------------------------------------

_NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13", "fourteen": "14",
    "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18", "nineteen": "19", "twenty": "20",
    "thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000", "million": "1e6",
    "billion": "1e9", "half": "0.5", "quarter": "0.25", "dozen": "12", "하나": "1", "둘": "2", "셋": "3", "넷": "4", "다섯": "5", "열": "10", "백": "100", "천": "1000",
    "만": "10000",
}

# canonical unit -> spellings
_UNITS = {
    "km": ("km", "kms", "kilometer", "kilometers", "kilometre", "kilometres", "킬로미터", "킬로"),
    "mile": ("mi", "mile", "miles", "마일"),
    "m": ("meter", "meters", "metre", "metres", "미터"),
    "cm": ("cm", "centimeter", "centimeters", "centimetre", "centimetres", "센티미터", "센티"),
    "mm": ("mm", "millimeter", "millimeters"),
    "ft": ("ft", "foot", "feet", "피트"),
    "in": ("inch", "inches", "인치"),
    "yd": ("yd", "yard", "yards"),
    "kg": ("kg", "kgs", "kilogram", "kilograms", "kilo", "kilos", "킬로그램"),
    "g": ("gram", "grams", "그램"),
    "lb": ("lb", "lbs", "pound", "pounds", "파운드"),
    "oz": ("oz", "ounce", "ounces", "온스"),
    "l": ("liter", "liters", "litre", "litres", "리터"),
    "ml": ("ml", "milliliter", "milliliters", "millilitre", "millilitres"),
    "gal": ("gal", "gallon", "gallons", "갤런"),
    "cup": ("cup", "cups"),
    "tbsp": ("tbsp", "tablespoon", "tablespoons"),
    "tsp": ("tsp", "teaspoon", "teaspoons"),
    "c": ("c", "celsius", "centigrade", "°c", "℃", "섭씨"),
    "f": ("f", "fahrenheit", "°f", "℉", "화씨"),
    "k": ("kelvin",),
    "usd": ("usd", "dollar", "dollars", "$", "달러"),
    "eur": ("eur", "euro", "euros", "€", "유로"),
    "gbp": ("gbp", "sterling", "£", "파운드화"),
    "jpy": ("jpy", "yen", "¥", "엔"),
    "krw": ("krw", "won", "₩", "원화"),
    "cny": ("cny", "yuan", "rmb", "위안"),
    "btc": ("btc", "bitcoin", "bitcoins", "비트코인"),
    "mph": ("mph",), "kph": ("kph", "km/h", "kmh"),
    "gb": ("gb", "gigabyte", "gigabytes", "gib"), "mb": ("mb", "megabyte", "megabytes", "mib"),
    "tb": ("tb", "terabyte", "terabytes"), "kb": ("kb", "kilobyte", "kilobytes"),
    "bit": ("bit", "bits"), "byte": ("byte", "bytes"),
    "sec": ("sec", "secs", "second", "seconds", "초"), "min": ("minute", "minutes", "mins", "분"),
    "hour": ("hour", "hours", "hr", "hrs", "시간"), "day": ("day", "days", "일"),
    "week": ("week", "weeks", "주"), "month": ("month", "months", "개월"), "year": ("year", "years", "년"),
    "percent": ("percent", "%", "퍼센트"), "acre": ("acre", "acres"), "hectare": ("hectare", "hectares"),
    "sqft": ("sqft",), "calorie": ("calorie", "calories", "kcal", "칼로리"), "joule": ("joule", "joules"),
    "watt": ("watt", "watts", "w", "kw", "kilowatt", "kilowatts"), "volt": ("volt", "volts", "v"),
    "psi": ("psi",), "bar": ("bar",), "pa": ("pascal", "pascals", "kpa"),
    "deg": ("degree", "degrees", "°", "도"), "rad": ("radian", "radians"),
}
_UNIT_OF = {spelling: unit for unit, spellings in _UNITS.items() for spelling in spellings}
# Korean units are glued to what follows ("킬로미터인가요"): matched by prefix, longest first.
_KO_UNITS = sorted((sp for sp in _UNIT_OF if "\uac00" <= sp[0] <= "\ud7a3" and len(sp) > 1), key=len, reverse=True)
# Words that are units only next to a number ("in", "w", "v", "min", "second", "day" are ordinary words too).
_UNIT_NEEDS_NUMBER = {"in", "w", "v", "bar", "min", "sec", "second", "seconds", "day", "days", "week", "weeks",
                      "month", "months", "year", "years", "hour", "hours", "g", "m", "c", "f", "k", "도", "분",
                      "초", "일", "주", "년", "엔", "won", "cup", "cups", "degree", "degrees"}

_NEGATIONS = {"not", "no", "never", "n't", "cannot", "without", "none", "nobody", "nothing", "neither", "nor",
              "nowhere", "안", "못", "않", "않다", "않아", "않나요", "않아요", "없", "없는", "없어", "없나요", "없어요", "아니",
              "아닌", "아니다", "아니요", "말고", "금지"}

# Pairs whose members flip an answer. Both members are also "polar": one appearing on one side only is a
# change of meaning even without its partner ("start the server" vs "run the server" is left to the
# substitution check; "how to start" vs "how to stop" is caught here).
_ANTONYMS = [
    ("buy", "sell"), ("buying", "selling"), ("bought", "sold"), ("purchase", "sell"), ("accept", "decline"),
    ("accept", "reject"), ("approve", "reject"), ("approve", "deny"), ("allow", "deny"), ("allow", "block"),
    ("allow", "forbid"), ("permit", "forbid"), ("enable", "disable"), ("enabled", "disabled"),
    ("on", "off"), ("open", "close"), ("open", "closed"), ("opening", "closing"), ("start", "stop"),
    ("start", "end"), ("begin", "end"), ("beginning", "end"), ("starting", "stopping"), ("pause", "resume"),
    ("best", "worst"), ("better", "worse"), ("ascending", "descending"), ("asc", "desc"),
    ("increase", "decrease"), ("increasing", "decreasing"), ("raise", "lower"), ("rise", "fall"),
    ("up", "down"), ("upload", "download"), ("uploading", "downloading"), ("import", "export"),
    ("importing", "exporting"), ("input", "output"), ("inbound", "outbound"), ("incoming", "outgoing"),
    ("ingress", "egress"), ("add", "remove"), ("add", "delete"), ("adding", "removing"), ("insert", "delete"),
    ("create", "delete"), ("create", "destroy"), ("install", "uninstall"), ("installing", "uninstalling"),
    ("encrypt", "decrypt"), ("encryption", "decryption"), ("encode", "decode"), ("encoding", "decoding"),
    ("compress", "decompress"), ("compression", "decompression"), ("zip", "unzip"), ("lock", "unlock"),
    ("mount", "unmount"), ("subscribe", "unsubscribe"), ("follow", "unfollow"), ("like", "dislike"),
    ("love", "hate"), ("win", "lose"), ("won", "lost"), ("winning", "losing"), ("gain", "loss"),
    ("profit", "loss"), ("win", "loss"), ("pass", "fail"), ("passed", "failed"), ("success", "failure"),
    ("true", "false"), ("yes", "no"), ("right", "wrong"), ("correct", "incorrect"), ("valid", "invalid"),
    ("legal", "illegal"), ("safe", "unsafe"), ("safe", "dangerous"), ("healthy", "unhealthy"),
    ("possible", "impossible"), ("able", "unable"), ("likely", "unlikely"), ("visible", "invisible"),
    ("public", "private"), ("internal", "external"), ("inside", "outside"), ("indoor", "outdoor"),
    ("indoors", "outdoors"), ("above", "below"), ("over", "under"), ("before", "after"), ("early", "late"),
    ("earlier", "later"), ("earliest", "latest"), ("first", "last"), ("min", "max"), ("minimum", "maximum"),
    ("minimize", "maximize"), ("lowest", "highest"), ("low", "high"), ("lower", "higher"), ("least", "most"),
    ("less", "more"), ("fewer", "more"), ("small", "large"), ("small", "big"), ("smaller", "larger"),
    ("smaller", "bigger"), ("smallest", "largest"), ("smallest", "biggest"), ("short", "long"),
    ("shorter", "longer"), ("shortest", "longest"), ("slow", "fast"), ("slower", "faster"),
    ("slowest", "fastest"), ("cheap", "expensive"), ("cheaper", "pricier"), ("cheapest", "priciest"),
    ("hot", "cold"), ("warm", "cool"), ("hotter", "colder"), ("hottest", "coldest"), ("heat", "cool"),
    ("heating", "cooling"), ("wet", "dry"), ("light", "dark"), ("light", "heavy"), ("lighter", "heavier"),
    ("easy", "hard"), ("easy", "difficult"), ("easier", "harder"), ("simple", "complex"), ("old", "new"),
    ("older", "newer"), ("oldest", "newest"), ("young", "old"), ("younger", "older"), ("youngest", "oldest"),
    ("rich", "poor"), ("strong", "weak"), ("stronger", "weaker"), ("positive", "negative"),
    ("plus", "minus"), ("north", "south"), ("east", "west"), ("northern", "southern"), ("eastern", "western"),
    ("left", "right"), ("top", "bottom"), ("front", "back"), ("forward", "backward"), ("push", "pull"),
    ("send", "receive"), ("sending", "receiving"), ("sent", "received"), ("give", "take"), ("lend", "borrow"),
    ("lending", "borrowing"), ("borrow", "repay"), ("deposit", "withdraw"), ("debit", "credit"),
    ("import", "export"), ("arrive", "depart"), ("arrival", "departure"), ("arrivals", "departures"),
    ("enter", "exit"), ("entrance", "exit"), ("login", "logout"), ("log in", "log out"), ("sign in", "sign out"),
    ("connect", "disconnect"), ("online", "offline"), ("attach", "detach"), ("include", "exclude"),
    ("including", "excluding"), ("inclusive", "exclusive"), ("with", "without"), ("always", "never"),
    ("all", "none"), ("everyone", "nobody"), ("everything", "nothing"), ("same", "different"),
    ("similar", "different"), ("equal", "unequal"), ("sync", "async"), ("synchronous", "asynchronous"),
    ("static", "dynamic"), ("mutable", "immutable"), ("sorted", "unsorted"), ("ordered", "unordered"),
    ("signed", "unsigned"), ("upper", "lower"), ("uppercase", "lowercase"), ("major", "minor"),
    ("male", "female"), ("man", "woman"), ("men", "women"), ("boy", "girl"), ("husband", "wife"),
    ("mother", "father"), ("son", "daughter"), ("brother", "sister"), ("king", "queen"), ("day", "night"),
    ("morning", "evening"), ("am", "pm"), ("sunrise", "sunset"), ("summer", "winter"), ("spring", "autumn"),
    ("spring", "fall"), ("past", "future"), ("yesterday", "tomorrow"), ("ancient", "modern"),
    ("odd", "even"), ("prefix", "suffix"), ("head", "tail"), ("leading", "trailing"), ("client", "server"),
    ("frontend", "backend"), ("read", "write"), ("reading", "writing"), ("get", "set"), ("getter", "setter"),
    ("serialize", "deserialize"), ("marshal", "unmarshal"), ("merge", "split"), ("join", "split"),
    ("expand", "collapse"), ("show", "hide"), ("maximize", "minimize"), ("zoom in", "zoom out"),
    ("include", "omit"), ("to", "from"), ("pros", "cons"), ("advantages", "disadvantages"),
    ("benefits", "drawbacks"), ("cause", "effect"), ("question", "answer"), ("import", "export"),
    ("구매", "판매"), ("매수", "매도"), ("사다", "팔다"), ("최고", "최저"), ("최대", "최소"), ("오름차순", "내림차순"),
    ("증가", "감소"), ("상승", "하락"), ("켜기", "끄기"), ("켜다", "끄다"), ("열기", "닫기"), ("입력", "출력"),
    ("업로드", "다운로드"), ("수입", "수출"), ("찬성", "반대"), ("장점", "단점"), ("안전", "위험"), ("오전", "오후"),
    ("아침", "저녁"), ("낮", "밤"), ("여름", "겨울"), ("북쪽", "남쪽"), ("동쪽", "서쪽"), ("왼쪽", "오른쪽"),
    ("위", "아래"), ("앞", "뒤"), ("시작", "종료"), ("로그인", "로그아웃"), ("가입", "탈퇴"), ("추가", "삭제"),
    ("암호화", "복호화"), ("압축", "해제"),
]
_POLAR = {w for pair in _ANTONYMS for w in pair if " " not in w} - {"to", "from", "on", "in", "over", "up", "down",
                                                                      "with", "get", "back", "right", "left",
                                                                      "light", "like", "even", "take", "give",
                                                                      "set", "question", "answer", "all", "day", "am", "pm",
                                                                      "fall", "spring", "read", "top", "head"}
_OPPOSITE: dict[str, set[str]] = {}
for _a, _b in _ANTONYMS:
    _OPPOSITE.setdefault(_a, set()).add(_b)
    _OPPOSITE.setdefault(_b, set()).add(_a)

_TIME_WORDS = {
    "today", "tomorrow", "yesterday", "tonight", "morning", "afternoon", "evening", "night",
    "midnight", "noon", "weekend", "weekday", "daily", "weekly", "monthly",
    "yearly", "annually", "hourly", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday",
    "january", "february", "march", "april", "june", "july", "august", "september", "october",
    "november", "december", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    "spring", "summer", "autumn", "fall", "winter", "next", "last", "previous", "upcoming", "past", "future",
    "오늘", "내일", "어제", "모레", "그제", "지금", "현재", "아침", "점심", "저녁", "밤", "새벽", "오전", "오후", "정오", "자정",
    "주말", "평일", "월요일", "화요일", "수요일", "목요일", "금요일", "토요일", "일요일", "봄", "여름", "가을", "겨울",
    "다음", "지난", "이번", "올해", "내년", "작년",
}

_COMPARATIVES = {
    "more", "most", "less", "least", "fewer", "fewest", "better", "best", "worse", "worst", "higher", "highest",
    "lower", "lowest", "larger", "largest", "bigger", "biggest", "smaller", "smallest", "faster", "fastest",
    "slower", "slowest", "cheaper", "cheapest", "longer", "longest", "shorter", "shortest", "older", "oldest",
    "newer", "newest", "earlier", "earliest", "later", "latest", "greater", "greatest", "safer", "safest",
    "easier", "easiest", "harder", "hardest", "stronger", "strongest", "weaker", "weakest", "richer",
    "richest", "poorer", "poorest", "hotter", "hottest", "colder", "coldest", "warmer", "warmest", "cooler",
    "coolest", "heavier", "heaviest", "lighter", "lightest", "popular", "top", "max", "min", "maximum",
    "minimum", "more than", "less than", "최고", "최저", "최대", "최소", "가장", "더", "덜", "제일",
}
_EST_NOT_SUPERLATIVE = {"interest", "test", "request", "rest", "est", "forest", "honest", "suggest", "digest",
                        "manifest", "harvest", "protest", "contest", "invest", "latest", "guest", "quest",
                        "chest", "nest", "west", "vest", "pest", "modest", "arrest", "ingest", "unrest",
                        "attest", "midwest", "conquest", "backtest", "pytest", "jest", "priest", "crest"}

# Words a rephrasing may add, drop or swap freely: they do not change what is asked.
_FILLER = {
    "a", "an", "the", "is", "are", "was", "were", "be", "been", "being", "am", "do", "does", "did", "doing",
    "have", "has", "had", "i", "me", "my", "we", "our", "you", "your", "it", "its", "this", "that", "these",
    "those", "there", "here", "what", "what's", "which", "who", "whom", "whose", "how", "why", "when", "where",
    "can", "could", "would", "should", "will", "shall", "may", "might", "must", "please", "kindly", "tell",
    "explain", "describe", "show", "give", "let", "know", "want", "need", "like", "wondering", "wonder",
    "curious", "question", "quick", "help", "hi", "hello", "hey", "thanks", "thank", "so", "just", "really",
    "actually", "basically", "exactly", "some", "any", "about", "regarding", "on", "of", "for", "to", "in",
    "at", "by", "as", "and", "or", "if", "then", "than", "also", "too", "very", "much", "many", "way", "ways",
    "best way", "get", "go", "going", "possible", "someone", "somebody", "one", "s", "'s", "us", "they",
    "them", "their", "he", "she", "his", "her", "with", "from", "into", "onto", "up", "out", "over",
    "info", "information", "details", "detail", "overview", "guide", "steps", "step", "process",
    "procedure", "method", "methods", "approach", "mean", "means", "meaning", "definition", "define",
    "work", "works", "working", "use", "used", "using", "make", "made", "sure", "okay", "ok", "well",
    "은", "는", "이", "가", "을", "를", "좀", "요", "주세요", "알려줘", "알려주세요", "뭐야", "뭔가요", "무엇인가요", "어때요",
    "어때", "어떻게", "하나요", "해요", "있나요", "인가요", "가요", "까요", "궁금해요", "말해줘",
}
_SYNONYMS = [
    {"big", "large", "huge"}, {"small", "little", "tiny"}, {"fast", "quick", "rapid", "speedy"},
    {"buy", "purchase"}, {"begin", "start", "commence"}, {"end", "finish", "conclude"},
    {"fix", "repair", "resolve", "solve"}, {"error", "exception"}, {"make", "create", "build", "generate"},
    {"obtain", "get", "acquire", "retrieve", "fetch"}, {"find", "locate", "discover", "look"},
    {"need", "require"}, {"use", "utilize", "employ"}, {"car", "automobile", "vehicle"},
    {"picture", "photo", "image"}, {"movie", "film"}, {"doctor", "physician"}, {"job", "work", "career"},
    {"task", "job"}, {"help", "assist", "support"}, {"change", "modify", "alter", "update", "edit"},
    {"remove", "delete", "erase"}, {"show", "display", "print", "list", "view", "see"},
    {"configure", "setup", "set", "configuration", "config"}, {"install", "setup"},
    {"function", "method"}, {"folder", "directory"}, {"app", "application", "program"},
    {"handle", "manage", "deal"}, {"allowed", "permitted"}, {"cost", "price"}, {"correct", "right"},
    {"explain", "describe", "clarify"}, {"quickly", "fast"}, {"difference", "differences", "differ"},
    {"benefit", "advantage"}, {"issue", "problem"}, {"choose", "select", "pick"}, {"run", "execute"},
    {"connect", "link"}, {"check", "verify", "validate"}, {"speed", "performance"},
    {"dataset", "datasets", "data"}, {"model", "models"}, {"library", "package"}, {"all", "every", "each"},
    {"quit", "exit", "leave"}, {"see", "check", "view"}, {"make", "write", "create"},
    {"wrote", "author", "authored", "writer", "written"}, {"painted", "painter"}, {"invented", "inventor"},
    {"discovered", "discoverer"}, {"tall", "height"}, {"founded", "founder"}, {"directed", "director"}, {"composed", "composer"},
]
_SYNONYM_OF: dict[str, set[str]] = {}
for _group in _SYNONYMS:
    for _w in _group:
        _SYNONYM_OF.setdefault(_w, set()).update(_group)

# Common words that may start a sentence capitalised without being a name.
_COMMON_STARTERS = {
    "what", "how", "why", "when", "where", "who", "which", "is", "are", "can", "could", "would", "should",
    "do", "does", "did", "will", "please", "tell", "explain", "describe", "give", "show", "list", "convert",
    "translate", "write", "find", "i", "my", "the", "a", "an", "in", "on", "for", "to", "from", "with", "best",
    "worst", "any", "some", "if", "hi", "hello", "hey", "quick", "compare", "calculate", "define", "summarize",
    "create", "make", "get", "set", "use", "using", "recommend", "suggest", "name", "help", "let", "it", "this",
    "that", "there", "weather", "time", "price", "cost", "steps", "ways", "difference", "top", "average",
    "distance", "population", "history", "capital", "meaning", "definition", "by", "at", "as",
}
_PLACES = {
    # A small gazetteer for lower-cased place names; capitalised ones are caught as entities anyway.
    "london", "manchester", "liverpool", "birmingham", "leeds", "glasgow", "edinburgh", "bristol", "paris",
    "lyon", "marseille", "berlin", "munich", "hamburg", "frankfurt", "madrid", "barcelona", "rome", "milan",
    "venice", "naples", "amsterdam", "rotterdam", "brussels", "vienna", "zurich", "geneva", "prague",
    "warsaw", "budapest", "lisbon", "porto", "dublin", "oslo", "bergen", "stockholm", "copenhagen",
    "helsinki", "athens", "istanbul", "moscow", "kyiv", "cairo", "lagos", "nairobi", "johannesburg",
    "dubai", "mumbai", "delhi", "bangalore", "karachi", "beijing", "shanghai", "shenzhen", "hong kong",
    "tokyo", "osaka", "kyoto", "seoul", "busan", "incheon", "taipei", "singapore", "bangkok", "hanoi",
    "jakarta", "manila", "sydney", "melbourne", "auckland", "toronto", "vancouver", "montreal", "boston",
    "chicago", "seattle", "denver", "austin", "dallas", "houston", "miami", "atlanta", "phoenix", "portland",
    "nyc", "la", "sf", "mexico", "bogota", "lima", "santiago", "buenos aires", "rio", "sao paulo",
    "france", "germany", "spain", "italy", "england", "scotland", "wales", "ireland", "uk", "usa", "us",
    "canada", "japan", "china", "korea", "india", "brazil", "australia", "russia", "ukraine", "poland",
    "sweden", "norway", "denmark", "finland", "netherlands", "belgium", "switzerland", "austria", "greece",
    "turkey", "egypt", "nigeria", "kenya", "vietnam", "thailand", "indonesia", "philippines", "argentina",
    "서울", "부산", "대구", "인천", "광주", "대전", "울산", "세종", "제주", "수원", "창원", "고양", "용인", "성남", "청주",
    "전주", "포항", "강릉", "춘천", "경주", "여수", "일본", "중국", "미국", "영국", "한국", "도쿄", "오사카", "뉴욕", "런던", "파리",
}
_KO_PARTICLES = ("에서는", "으로는", "에게서", "까지는", "부터는", "에서", "으로", "에게", "한테", "까지", "부터", "처럼",
                 "보다", "이랑", "하고", "과의", "와의", "에는", "의", "은", "는", "이", "가", "을", "를", "에", "로", "와", "과",
                 "도", "만", "랑", "요")

_TOKEN = re.compile(r"°[cfk](?![a-z])|[0-9]+(?:[.,][0-9]+)*|[a-z]+(?:'[a-z]+)?|[\uac00-\ud7a3]+|[°℃℉$€£¥₩%]|[a-z]")
_PREPOSITIONS = {"in", "at", "from", "to", "near", "for", "of", "about", "into", "on", "between", "vs", "versus"}


@dataclass(frozen=True, slots=True)
class Features:
    tokens: tuple[str, ...]
    numbers: tuple[str, ...]
    units: tuple[str, ...]
    negations: int
    polar: frozenset[str]
    times: frozenset[str]
    comparatives: frozenset[str]
    entities: frozenset[str]


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.replace("’", "'").replace("‘", "'")
    text = re.sub(r"\b(can)'t\b", r"\1 not", text)
    text = re.sub(r"\bwon't\b", "will not", text)
    text = re.sub(r"n't\b", " not", text)
    text = re.sub(r"'(s|re|ve|ll|d|m)\b", r" '\1", text)
    text = re.sub(r"(\d)([a-z°%$€£¥₩℃℉])", r"\1 \2", text)  # 10km -> 10 km
    text = re.sub(r"([$€£¥₩])(\d)", r"\1 \2", text)
    return text


def _strip_particle(token: str) -> str:
    if not ("\uac00" <= token[0] <= "\ud7a3") or len(token) < 2:
        return token
    for particle in _KO_PARTICLES:
        if token.endswith(particle) and len(token) > len(particle):
            return token[: -len(particle)]
    return token


@lru_cache(maxsize=4096)
def features(text: str) -> Features:
    """Answer-changing features of a question (cached: the same candidate is checked many times)."""
    raw_tokens = _TOKEN.findall(_normalise(text))
    tokens = tuple(_strip_particle(t) for t in raw_tokens)
    numbers, units = [], []
    for i, tok in enumerate(tokens):
        if tok[0].isdigit():
            numbers.append(tok.replace(",", ""))
        elif tok in _NUMBER_WORDS and not (tok == "one" and i + 1 < len(tokens) and tokens[i + 1] in ("of",)):
            numbers.append(_NUMBER_WORDS[tok])
        unit = _UNIT_OF.get(tok)
        if unit is None and "\uac00" <= tok[0] <= "\ud7a3":
            unit = next((_UNIT_OF[sp] for sp in _KO_UNITS if tok.startswith(sp)), None)
        if unit is not None:
            near_number = any(t[0].isdigit() or t in _NUMBER_WORDS for t in tokens[max(0, i - 2): i + 1])
            if tok not in _UNIT_NEEDS_NUMBER or near_number or _conversion_context(tokens, i):
                units.append(unit)
    negations = sum(1 for t in tokens if t in _NEGATIONS or (len(t) > 3 and t.startswith("un")
                                                              and t[2:] in _POLAR))
    words = set(tokens)
    bigrams = {f"{a} {b}" for a, b in itertools.pairwise(tokens)}
    polar = frozenset((words | bigrams) & (_POLAR | {p for pair in _ANTONYMS for p in pair if " " in p}))
    times = frozenset(words & _TIME_WORDS) | frozenset(t for t in tokens if re.fullmatch(r"(19|20)\d\d", t)) | {
        # "7 am" / "7 pm": a time only after a number ("I am" is not)
        t for prev, t in itertools.pairwise(tokens) if t in ("am", "pm") and prev[0].isdigit()}
    comparatives = frozenset((words | bigrams) & _COMPARATIVES) | frozenset(
        t for t in tokens if t.endswith("est") and len(t) > 5 and t not in _EST_NOT_SUPERLATIVE and t.isalpha()
        and t.isascii())
    return Features(tokens, tuple(numbers), tuple(units), negations, polar, times, comparatives,
                    _entities(text, tokens))


def _conversion_context(tokens: tuple[str, ...], i: int) -> bool:
    window = tokens[max(0, i - 3): i + 3]
    return any(t in ("to", "into", "from", "convert", "conversion", "per", "in") for t in window)


def _entities(text: str, tokens: tuple[str, ...]) -> frozenset[str]:
    """Names: all-caps words, words mixing letters and digits, capitalised words that do not open a sentence
    (an opening word is a name only if it is not a common word), and known places."""
    found = set()
    normal = unicodedata.normalize("NFKC", text)
    lower_words = set(re.findall(r"(?<![A-Za-z])[a-z][a-z]+", normal))
    for match in re.finditer(r"[A-Za-z][A-Za-z0-9\-+.#]*", normal):
        word = match.group().rstrip(".")
        lower = " ".join(_TOKEN.findall(_normalise(word)))
        if not lower or lower == "i":
            continue
        before = normal[: match.start()].rstrip(" \"'`*([")
        opens_sentence = not before or before[-1] in ".?!:\n"
        if word.isupper() and len(word) >= 2 and lower not in ("am", "pm", "ok"):
            found.add(lower)
        elif any(c.isdigit() for c in word) and any(c.isalpha() for c in word):
            found.add(lower)  # gpt-4, python3, iphone15
        elif word[0].isupper() and word.lower() not in lower_words and (
                not opens_sentence or lower not in _COMMON_STARTERS | _FILLER):
            found.add(lower)
    joined = f" {' '.join(tokens)} "
    found.update(p for p in _PLACES if f" {p} " in joined)
    return frozenset(found)


def _stems(word: str) -> set[str]:
    """The word and what it may be an inflection of (files -> file, boxes -> box, painted -> paint)."""
    out = {word}
    for suffix in ("ing", "ed", "es", "s", "ly", "d"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            out.add(word[: -len(suffix)])
    return out


def _same_meaning(a: str, b: str) -> bool:
    """Same word, an inflection of it (painted / painter / paints), or a listed synonym."""
    if a == b or _stems(a) & _stems(b) or b in _SYNONYM_OF.get(a, ()):
        return True
    shared = len(os.path.commonprefix([a, b]))
    return shared >= 5 and shared >= 0.7 * min(len(a), len(b)) and b not in _OPPOSITE.get(a, ())


def verify(query: str, candidate: str) -> str | None:
    """None if serving ``candidate``'s answer for ``query`` is safe; otherwise the reason it is not."""
    if query == candidate:
        return None
    q, c = features(query), features(candidate)
    if sorted(q.numbers) != sorted(c.numbers):
        return "number"
    if q.units and c.units and q.units != c.units:
        return "unit" if sorted(q.units) != sorted(c.units) else "direction"
    if q.negations != c.negations:
        return "negation"
    short = max(len(q.tokens), len(c.tokens)) <= _SHORT
    if _swapped(q.polar, c.polar, q.tokens, c.tokens, short):
        return "antonym"
    if q.times != c.times:
        return "time"
    if _swapped(q.comparatives, c.comparatives, q.tokens, c.tokens, short):
        return "comparative"
    q_text, c_text = f" {' '.join(q.tokens)} ", f" {' '.join(c.tokens)} "
    if any(f" {e} " not in c_text for e in q.entities) or any(f" {e} " not in q_text for e in c.entities):
        return "entity"
    if not short:
        return None
    # Question-length text: one word carries the meaning, so wording changes are checked too.
    if _preposition_object_swap(q.tokens, c.tokens):
        return "entity"
    if _operands_swapped(q.tokens, c.tokens, q.entities | c.entities):
        return "direction"
    if _small_substitution(q.tokens, c.tokens):
        return "substitution"
    return None


def _swapped(a: frozenset[str], b: frozenset[str], a_tokens: tuple[str, ...], b_tokens: tuple[str, ...],
             short: bool) -> bool:
    """A polar word on one side meets its opposite on the other, or (in a question-length text) a
    different polar word. One side alone carrying one ('make my site faster' / 'speed up my site') is
    left to the substitution check: rephrasings add and drop such words."""
    only_a, only_b = a - b, b - a
    if short and only_a and only_b:
        return True
    words_a, words_b = set(a_tokens), set(b_tokens)
    return any(_OPPOSITE.get(w, set()) & words_b for w in only_a) or any(
        _OPPOSITE.get(w, set()) & words_a for w in only_b)


def _preposition_object_swap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """'weather in oslo' vs 'weather in bergen': the same preposition governs different content words."""
    objects_a = {(p, o) for p, o in itertools.pairwise(a) if p in _PREPOSITIONS and o not in _FILLER}
    objects_b = {(p, o) for p, o in itertools.pairwise(b) if p in _PREPOSITIONS and o not in _FILLER}
    for prep, obj in objects_a:
        others = {o for p, o in objects_b if p == prep}
        if others and not any(_same_meaning(obj, o) for o in others) and obj not in b:
            return True
    return False


_SHORT = 20  # tokens: a question rather than a passage

_DIRECTIONAL = {"to", "into", "from", "than", "vs", "versus", "over", "per", "에서", "까지"}


def _operands_swapped(a: tuple[str, ...], b: tuple[str, ...], entities: frozenset[str]) -> bool:
    """'X to Y' vs 'Y to X', 'A faster than B' vs 'B faster than A': the same words, the other direction."""
    def pairs(tokens: tuple[str, ...]) -> set[tuple[str, str, str]]:
        content = [t for t in tokens if t not in _FILLER or t in _DIRECTIONAL]
        out = set()
        for i, tok in enumerate(content):
            if tok in _DIRECTIONAL and 0 < i < len(content) - 1:
                before = [t for t in content[:i] if t not in _DIRECTIONAL and t not in _COMPARATIVES]
                if before:
                    out.add((before[-1], tok, content[i + 1]))
        return out
    pa, pb = pairs(a), pairs(b)
    if any((y, p, x) in pb for x, p, y in pa if x != y):
        return True
    # the order in which the named things appear, where the question has a direction
    if _DIRECTIONAL & set(a) and _DIRECTIONAL & set(b):
        order_a = [t for t in a if t in entities]
        order_b = [t for t in b if t in entities]
        return sorted(order_a) == sorted(order_b) and len(set(order_a)) > 1 and order_a != order_b
    return False


def _small_substitution(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Nearly identical wording with a content word swapped for an unrelated one ('peel an apple' vs
    'peel an orange'). Rephrasings change framing words; these keep the frame and change the subject."""
    content_a = [t for t in a if t not in _FILLER]
    content_b = [t for t in b if t not in _FILLER]
    matcher = difflib.SequenceMatcher(a=content_a, b=content_b, autojunk=False)
    changed = 0
    swaps: list[tuple[list[str], list[str]]] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        changed += max(i2 - i1, j2 - j1)
        if op == "replace":
            swaps.append((content_a[i1:i2], content_b[j1:j2]))
    if not swaps or changed > 2:
        return False
    return any(not all(any(_same_meaning(o, n) for n in new) for o in old) for old, new in swaps)
